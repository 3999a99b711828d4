"""The class view inside the hub: a hub-managed service at ``/services/class/``, for the instructor only.

JupyterHub starts it (``python -m labkit.workshop.service``) as the instructor's Unix user, the only one
besides root that reads the class folder. Every page is a ``HubOAuthenticated`` tornado handler: a visitor
is sent through the hub's OAuth, and only a user holding ``access:services!service=class`` gets in (the
admin role, which only the instructor has); a learner gets 403. Pages: ``/services/class/`` (HTML,
refreshing every 10 s) and ``/services/class/json``.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from labkit.core import contract
from labkit.records import classlog
from labkit.workshop import classpage, classview

REFRESH = 10  # seconds between reloads of the page


def current_view() -> classview.View:
    folder = Path(os.environ[contract.CLASS_DIR])
    learners = [w for w in os.environ.get(contract.WORKSHOP_LEARNERS, "").split(",") if w]
    reading = classlog.read(folder, learners=learners or None)  # each record is its file owner's
    return classview.build(reading.records, learners, reading.problems, reading.reveals)


class PageHandler(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.write(classpage.html_page(current_view(), "Class view", refresh=REFRESH))


class JsonHandler(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(current_view().to_dict()))


def make_app() -> web.Application:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    return web.Application([
        (prefix, PageHandler),
        (url_path_join(prefix, "json"), JsonHandler),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
    ], cookie_secret=os.urandom(32))


async def main() -> None:
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    make_app().listen(url.port, url.hostname)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
