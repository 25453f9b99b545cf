"""What views answer with besides their templates' HTML: a page with its status (`with_status`), files to download
(`attachment`, `month_document`, `send_export`) and amounts as JSON documents carry them (`micros_text`,
`micros_by_currency`). Shared by the pages, the downloads and the API."""

from __future__ import annotations

from flask import Response, abort, send_file

from web.services import services


def attachment(body: str | bytes, mimetype: str, filename: str) -> Response:
    """A body to download as `filename`, never kept by the browser or a proxy."""
    response = Response(body, mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    response.headers["Cache-Control"] = "no-store"  # billing data: not kept by the browser or a proxy
    return response


def with_status(body: str, status: int) -> str | tuple[str, int]:
    """A page answered with `status` (a form refused: 400), as a view returns it: the body alone when 200."""
    return body if status == 200 else (body, status)


DOCUMENT_TYPES = {"csv": "text/csv", "pdf": "application/pdf"}
"""The media type of each format an advertiser's monthly document is downloaded in (`month_document`)."""


def month_document(body: str | bytes, what: str, advertiser_id: str, month: str, extension: str) -> Response:
    """An advertiser's document of a month (`what`: a statement, an invoice) to download as a CSV or PDF file
    (`extension`), named `adbill-WHAT-ADVERTISER-MONTH.EXTENSION`."""
    return attachment(body, DOCUMENT_TYPES[extension], f"adbill-{what}-{advertiser_id}-{month}.{extension}")


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
