"""The CPU-demand model: the SoCC'18 curve fit, sweet spots and the published curves."""
