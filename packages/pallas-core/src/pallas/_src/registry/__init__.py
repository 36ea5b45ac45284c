"""The plugin registry: hook specifications, discovery and backend selection."""
