"""`adbill web`: the admin UI under gunicorn, a production WSGI server (threaded workers, keep-alive).

Each worker process builds its own app (and its own Redis connections) after the fork. The secret key file is
created here, once, before any worker starts.
"""

from __future__ import annotations

from typing import Any, Protocol

from gunicorn.app.base import BaseApplication

from web.app import WebSettings, create_app
from web.security import load_or_create_secret


class ServingSettings(WebSettings, Protocol):
    """What serving needs on top of the app's settings."""

    @property
    def web_host(self) -> str: ...
    @property
    def web_port(self) -> int: ...
    @property
    def web_workers(self) -> int: ...
    @property
    def web_threads(self) -> int: ...


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, settings: ServingSettings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return create_app(self.settings)


def gunicorn_options(settings: ServingSettings) -> dict[str, Any]:
    """gunicorn's configuration from the settings: gthread workers keep connections alive for polling pages."""
    return {
        "bind": f"{settings.web_host}:{settings.web_port}",
        "workers": settings.web_workers,
        "worker_class": "gthread",
        "threads": settings.web_threads,
        "keepalive": 30,
        "timeout": 30,
        "graceful_timeout": 10,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "info",
        "proc_name": "adbill-web",
        "control_socket_disable": True,
    }


def serve(settings: ServingSettings) -> int:
    """Run until SIGTERM or Ctrl-C."""
    load_or_create_secret(settings.web_secret_file)
    print(
        f"adbill web on http://{settings.web_host}:{settings.web_port}/ (accounts: {settings.accounts_store().where})",
        flush=True,
    )
    _Gunicorn(settings, gunicorn_options(settings)).run()
    return 0
