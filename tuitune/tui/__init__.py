"""The Textual UI. A thin layer: it renders the session's state and calls the session's actions."""
