"""The OpenAI-compatible HTTP server (`minfer serve`): create_app(engine_factory, served_name=...)."""

from minfer.server.app import DEFAULT_MAX_BODY, create_app

__all__ = ["DEFAULT_MAX_BODY", "create_app"]
