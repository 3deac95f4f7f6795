"""pytest-jupyter's fixtures and hooks (``jp_fetch``, ``jp_serverapp``, async tests) for the
sidebar's server-extension tests only.

Not ``pytest_plugins``: registered that way, its autouse fixtures wrap every test of the session
in an asyncio loop they close afterwards, which breaks Playwright's synchronous API in
tests/browser ("Cannot close a running event loop"). Imported into a conftest, its fixtures and
hooks apply to this folder's tests alone.
"""

from pytest_jupyter.jupyter_server import *  # noqa: F403
