"""Translation as a service: an HTTP API (FastAPI) over the Translator, with requests batched together,
and a page that shows a translation, its n-best list and where the model looked."""

from nmt.serve.app import create_app, listen, served_url, trusted_hosts

__all__ = ["create_app", "listen", "served_url", "trusted_hosts"]
