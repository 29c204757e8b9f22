"""A local HTTP server answering as the clouds' price APIs do, from responses recorded in their real shapes
(tests/fixtures/prices/): EC2's DescribeSpotPriceHistory (query protocol, XML, two pages by nextToken), the
Price List API's GetProducts (JSON protocol, PriceList of JSON strings), Azure's Retail Prices API (JSON,
paged by NextPageLink) and GCP's Cloud Billing Catalog SKUs (JSON, paged by nextPageToken, bearer token). boto3 reaches it through ``endpoint_url``; the Azure reader through its URL.

moto's describe_spot_price_history answers one constant price, so it cannot test which zone's entry wins.
"""
from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prices"
AZURE_HOST = "https://prices.azure.com:443"
GCP_SKUS = "/v1/services/6F81-5844-456A/skus"
TOKEN = "test-token"  # what a test's stand-in for Google's credentials hands the Cloud Billing Catalog


class FakePrices:
    """``with FakePrices() as fake:`` ``fake.url`` is the base URL; ``fake.requests`` what was asked, in order."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.azure_filters: list[str] = []
        self.raw_queries: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, body: bytes, content_type: str, status: int = 200) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                target = self.headers.get("X-Amz-Target", "")
                if target == "AWSPriceListService.GetProducts":
                    owner.requests.append("pricing.GetProducts")
                    filters = {f["Field"]: f["Value"] for f in json.loads(body)["Filters"]}
                    path = FIXTURES / f"pricing-get-products-{filters['instanceType']}.json"
                    page = path.read_bytes() if path.is_file() else b'{"FormatVersion": "aws_v1", "PriceList": []}'
                    return self._answer(page, "application/x-amz-json-1.1")
                form = urllib.parse.parse_qs(body)
                if form.get("Action") == ["DescribeSpotPriceHistory"]:
                    owner.requests.append("ec2.DescribeSpotPriceHistory")
                    page = 2 if form.get("NextToken") else 1
                    return self._answer((FIXTURES / f"ec2-spot-price-history-page{page}.xml").read_bytes(), "text/xml")
                self._answer(b"unknown action", "text/plain", 400)

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                if url.path == GCP_SKUS:
                    owner.requests.append("gcp.skus")
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        return self._answer(b'{"error": {"code": 401, "status": "UNAUTHENTICATED"}}', "application/json", 401)
                    page = 2 if urllib.parse.parse_qs(url.query).get("pageToken") else 1
                    return self._answer((FIXTURES / f"gcp-billing-skus-page{page}.json").read_bytes(), "application/json")
                if url.path != "/api/retail/prices":
                    return self._answer(b"not found", "text/plain", 404)
                owner.requests.append("azure.retail")
                owner.raw_queries.append(url.query)
                query = urllib.parse.parse_qs(url.query)
                owner.azure_filters += query.get("$filter", [])
                page = 2 if query.get("$skip") else 1
                text = (FIXTURES / f"azure-retail-prices-page{page}.json").read_text()
                self._answer(text.replace(AZURE_HOST, owner.url).encode(), "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoints(self) -> dict[str, str]:
        return {"ec2": self.url, "pricing": self.url, "azure": f"{self.url}/api/retail/prices",
                "gcp": f"{self.url}{GCP_SKUS}"}

    def __enter__(self) -> "FakePrices":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
