"""Reads the gateway's /metrics (Prometheus text) for the e2e tests."""
import urllib.request

from imgw import URL


def http_base(url=None):
    return (url or URL).replace("ws://", "http://").replace("wss://", "https://").rstrip("/")


def scrape(url=None):
    return urllib.request.urlopen(http_base(url) + "/metrics", timeout=30).read().decode()


def metric(name, url=None, text=None):
    """Value of a gateway metric without labels (0 when absent)."""
    for line in (text if text is not None else scrape(url)).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
