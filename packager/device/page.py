"""One page a person opens per bundle: reports/index.html and its JSON twin reports/index.json,
written by `build`, refreshed by `verify` and `deploy` (their reports land beside it) and by
`edgepack report BUNDLE`. Everything on it is read from the manifest and the reports."""

import json
from html import escape
from pathlib import Path

from ..bundle.manifest import read_manifest
from .page_data import SCHEMA, page_data
from .page_html import render
from .reports import REPORTS, bundle_digest, write_files

PAGE, TWIN = "index.html", "index.json"


def write_page(bundle: Path) -> Path:
    """Write (or refresh) BUNDLE/reports/index.html and index.json; returns the page's path.
    Written without following links, each file whole or not at all (reports.write_files)."""
    bundle = Path(bundle)
    read_manifest(bundle)   # a folder that is no bundle: BundleError naming it
    digest = bundle_digest(bundle)
    try:
        data = page_data(bundle, digest)
        files = {TWIN: json.dumps(data, indent=1) + "\n", PAGE: render(data)}
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        # the manifest's shape is checked, the figures inside its records are not: a manifest
        # edited by hand (or hostile) gets a page that says so, never a crash of verify
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        files = {TWIN: json.dumps({"schema": SCHEMA, "digest": digest, "unreadable": why},
                                  indent=1) + "\n", PAGE: unreadable(digest, why)}
    return write_files(bundle, [REPORTS], files) / PAGE


def unreadable(digest: str, why: str) -> str:
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>edgepack "
            "bundle</title></head><body><h1>This bundle's records cannot be shown</h1><p>"
            f"{escape(why)} (digest <code>{escape(digest)}</code>). The manifest holds figures "
            "edgepack did not write there: rebuild the bundle; its reports are in this folder."
            "</p></body></html>\n")
