"""The admin limits (``coda-node limit``) as each tick reads them: none while the file cannot
be read, all but the damaged entries while some are, and each error logged once, not on
every tick it goes on."""

from __future__ import annotations

import logging

from coda_node.enforce.state import Limit, LimitsFile, StateError

log = logging.getLogger("coda-node")


class AdminLimits:
    """The limits file read afresh each tick, remembering the last error it logged."""

    def __init__(self) -> None:
        self._error: str | None = None
        self._refused: list[str] = []

    def load(self, limits_file: LimitsFile) -> dict[int, Limit]:
        """The admin limits; none (the error logged once) while the file cannot be read,
        and those of the entries that are limits while others are not."""
        try:
            limits = limits_file.load()
        except StateError as exc:
            if str(exc) != self._error:
                log.error("%s", exc)
            self._error = str(exc)
            return {}
        self._error = None
        refused = limits_file.refused
        if refused != self._refused:
            for why in refused:
                if why not in self._refused:
                    log.error("%s", why)
            self._refused = list(refused)
        return limits
