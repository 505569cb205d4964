"""The console at `/`: pages for people, signed in with an API key, over the same REST API."""
