"""The profile store: profiles and usage records on disk, the drop directory and munge
credentials that feed it.
"""
