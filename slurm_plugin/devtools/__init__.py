"""Development tools: the dev cluster, its accounting database, process helpers and the demo."""
