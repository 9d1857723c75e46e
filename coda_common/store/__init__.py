"""The profile store: profiles and usage records on disk."""
