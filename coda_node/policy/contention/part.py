"""What each of the eliminator's judging parts (attribution, holds, release) works on: its
settings, the step ladder, and the CPU jobs throttled and DNN jobs slowed now, shared with
the :class:`~coda_node.policy.contention.eliminator.Eliminator` that owns them. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coda_node.policy.contention.ladder import Ladder
from coda_node.policy.contention.params import ContentionParams
from coda_node.policy.contention.state import Throttled, Victim


@dataclass(eq=False)
class Part:
    params: ContentionParams
    ladder: Ladder
    throttled: Mapping[int, Throttled]
    victims: Mapping[int, Victim]
