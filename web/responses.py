"""What views answer with besides their templates: files to download (`attachment`, `send_export`) and amounts as
JSON documents carry them (`micros_text`, `micros_by_currency`). Shared by the pages, the downloads and the API."""

from __future__ import annotations

from flask import Response, abort, send_file

from web.services import services


def attachment(body: str | bytes, mimetype: str, filename: str) -> Response:
    """A body to download as `filename`, never kept by the browser or a proxy."""
    response = Response(body, mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    response.headers["Cache-Control"] = "no-store"  # billing data: not kept by the browser or a proxy
    return response


def send_export(period: str, name: str) -> Response:
    """The file of a finished export as an attachment, or 404."""
    path = services().exports.file(period, name)
    if path is None:
        abort(404)
    mimetypes = {"parquet": "application/vnd.apache.parquet", "csv": "text/csv", "json": "application/json"}
    response = send_file(
        path,
        mimetype=mimetypes.get(name.rsplit(".", 1)[-1], "text/plain"),
        as_attachment=True,
        download_name=f"adbill-{period}-{name}",
    )
    response.headers["Cache-Control"] = "no-store"  # billing data: not kept by the browser or a proxy
    return response


def micros_text(micros: int | None) -> str | None:
    """An amount in micros as a JSON document carries it: the integer's decimal digits as a string (None: null)."""
    return None if micros is None else str(micros)


def micros_by_currency(amounts: dict[str, int]) -> dict[str, str]:
    """Amounts per currency, each as `micros_text`."""
    return {currency: str(micros) for currency, micros in sorted(amounts.items())}
