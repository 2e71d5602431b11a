"""HTTP cases: mutated inference requests, wrong JSON types, broken bodies and framing headers, odd routes
and repository calls."""

from __future__ import annotations

import base64
import random
import urllib.parse
from typing import Any

from tests.support.fuzz.cases import HttpCase, junk, odd_name, odd_version
from tests.support.fuzz.discovery import ModelInfo
from tests.support.fuzz.mutations import RequestGenerator
from tests.support.fuzz.wire import compact_json, http_case, http_doc, infer_path


class HttpCases(RequestGenerator):
    """The HTTP half of the generator."""

    def http(self, rng: random.Random) -> HttpCase:
        r = rng.random()
        if r < 0.70:
            return self.http_infer(rng)
        if r < 0.85:
            return self.http_route(rng)
        return self.http_repository(rng)

    def http_infer(self, rng: random.Random) -> HttpCase:
        model = self.model(rng)
        if not model.inputs:
            return HttpCase("infer.not_ready", "POST", infer_path(model.name, ""), b"{}", unavailable_ok=True)
        req = self.valid(rng, model)
        labels = [self.mutate(rng, model, req) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
        binary = {i for i in range(len(req.inputs)) if rng.random() < 0.4}
        doc, tail = http_doc(req, binary)
        r = rng.random()
        if r < 0.35:
            labels.append(self.json_field(rng, model, doc))
        case = http_case("infer." + "+".join(labels or ["valid"]), req, doc, tail, self.maybe_unavailable(req))
        if rng.random() < 0.3:
            case.kind += "+" + self.http_bytes(rng, case, model)
        if rng.random() < 0.1 and "Content-Length" not in case.headers:
            case.chunked = True
            case.kind += "+chunked"
        return case

    def json_field(self, rng: random.Random, model: ModelInfo, doc: dict[str, Any]) -> str:
        """A JSON value of the wrong type (or shape) at one field of the request."""
        inputs = doc.get("inputs") or []
        item = rng.choice(inputs) if inputs else None
        field_ = rng.choice(
            [
                *("inputs", "id", "parameters", "outputs", "name", "datatype", "shape", "data", "in_params", "out"),
                *("top", "binary_size", "binary_size", "deep_data"),
            ]
        )
        value = junk(rng)
        sized = [i for i in inputs if isinstance(i, dict) and "binary_data_size" in (i.get("parameters") or {})]
        if field_ == "binary_size" and sized:
            p = rng.choice(sized)["parameters"]
            p["binary_data_size"] = rng.choice([p["binary_data_size"] + rng.choice([-4, -1, 1, 8]), 2**40, 2**63])
        elif field_ == "deep_data" and item is not None:
            item["data"] = f"@@deep{rng.choice([self.limits.max_json_depth, 200, 5000])}@@"  # see compact_json
        elif field_ in ("inputs", "id", "parameters", "outputs", "binary_size", "deep_data"):
            doc[field_] = value
        elif field_ == "top":
            doc["unknown_" + rng.choice(["a", "b"])] = value
        elif item is None:
            doc["inputs"] = [value]
        elif field_ == "in_params":
            p = item.setdefault("parameters", {}) if isinstance(item.get("parameters"), dict) else {}
            key = rng.choice(["binary_data_size", "shared_memory_region", "x", "triton_y", "binary_data"])
            p[key] = value
            item["parameters"] = p if rng.random() < 0.8 else value
        elif field_ == "out":
            doc["outputs"] = [rng.choice([value, {"name": value}, {"name": "OUTPUT0", "parameters": value}])]
            if rng.random() < 0.5:
                doc["outputs"].append({"name": "OUTPUT0", "parameters": {"binary_data": value}})
        elif field_ == "data" and rng.random() < 0.5 and isinstance(item.get("data"), list) and item["data"]:
            data = item["data"]
            data[rng.randrange(len(data))] = value  # one element of the wrong type
        elif field_ == "data" and rng.random() < 0.3:
            item["data"] = [item.get("data")]  # nested one level more
        elif rng.random() < 0.1:
            item.pop(field_, None)
        else:
            item[field_] = value
        return "json." + field_

    def http_bytes(self, rng: random.Random, case: HttpCase, model: ModelInfo) -> str:
        """Break the body or its framing headers."""
        body = case.body
        r = rng.randrange(10)
        if r == 0:
            case.body = body[: rng.randrange(len(body) + 1)]
            return "truncated"
        if r == 1:
            case.body = body + rng.randbytes(rng.randint(1, 64))
            return "trailing"
        if r == 2 and body:
            b = bytearray(body)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.choice([0x00, 0x80, 0xFF, 0xC3, ord("["), ord('"'), ord("\\")])
            case.body = bytes(b)
            return "flipped"
        if r == 3 and self.remote:  # values an HTTP client will send (no surrounding whitespace)
            case.headers["Inference-Header-Content-Length"] = rng.choice(
                ["-1", "abc", "1e3", "0x10", str(len(body) + 1), str(2**70), "0", "+5", "1 2"]
            )
            return "header_length"
        if r == 3:
            case.headers["Inference-Header-Content-Length"] = rng.choice(
                ["-1", "abc", "", " ", "1e3", "0x10", "\u0661", str(len(body) + 1), str(2**70), "0", "+5", " 7 "]
            ).encode("utf-8")  # bytes: httpx sends a non-ASCII value as is
            return "header_length"
        if r == 4:
            n = int(case.headers.get("Inference-Header-Content-Length", len(body)))  # ours: a number
            case.headers["Inference-Header-Content-Length"] = str(max(0, n + rng.choice([-2, -1, 1, 3])))
            return "header_length_off"
        if r == 5:
            case.body = rng.choice([b"", b" ", b"null", b"[]", b"{}", b'"x"', b"0", b"{", b"\xff\xfe", b"\x00" * 8])
            case.headers.pop("Inference-Header-Content-Length", None)
            return "tiny_body"
        if r == 6:
            depth = rng.choice([self.limits.max_json_depth + 1, 1000, 100_000])
            opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}"), (b'{"inputs":[', b"]}")])
            case.body = opener * depth + (closer * depth if rng.random() < 0.5 else b"")
            case.headers.pop("Inference-Header-Content-Length", None)
            return "deep"
        if r == 7:
            case.body = b"\xef\xbb\xbf" + body if rng.random() < 0.5 else body.replace(b'"', b'"\xff', 1)
            return "encoding"
        if r == 8 and not self.remote:
            # A Content-Length that lies (in process only: a real server would wait for the missing bytes).
            case.headers["Content-Length"] = rng.choice(
                ["-1", "abc", str(self.limits.max_body_bytes + 1), str(2**64), "1, 2"]
            )
            return "content_length"
        if self.limits.max_body_bytes <= 8 * 2**20:
            case.body = body + b" " * (self.limits.max_body_bytes + 1 - len(body))
            case.headers.pop("Inference-Header-Content-Length", None)
            return "over_max_body"
        case.body = body + b"\n\t "
        return "whitespace"

    def http_route(self, rng: random.Random) -> HttpCase:
        name = urllib.parse.quote(odd_name(rng, self.models), safe=rng.choice(["", "/%"]))
        version = urllib.parse.quote(odd_version(rng), safe="")
        prefix = f"/v2/models/{name}" + (f"/versions/{version}" if rng.random() < 0.5 else "")
        suffix = rng.choice(["", "/ready", "/config", "/stats", "/infer", "/nope"])
        method = rng.choice(["GET", "GET", "GET", "POST", "PUT", "DELETE"])
        if suffix == "/infer":
            model = rng.choice(self.ready)
            doc, _ = http_doc(self.valid(rng, model), set())
            return HttpCase("route.infer", "POST", prefix + suffix, compact_json(doc), unavailable_ok=True)
        path = rng.choice([prefix + suffix, "/v2/models/stats", "/v2", "/v2/health/ready", "/v2/nope", "/", "/v2//x"])
        return HttpCase("route." + (suffix.strip("/") or "metadata"), method, path, unavailable_ok=True)

    def http_repository(self, rng: random.Random) -> HttpCase:
        action = rng.choice(["index", "load", "unload"])
        r = rng.random()
        if r < 0.2:
            body = rng.choice([b"", b"{", b"\xff", b"[" * 5000, b"null", b"[]", b"{}", b'{"ready":true}'])
        elif r < 0.6:
            params = {rng.choice(["config", "file:1/model.onnx", "unload_dependents", "x", "ready"]): junk(rng)}
            if rng.random() < 0.3:
                params = {"file:a": base64.b64encode(rng.randbytes(16)).decode()}
            body = compact_json(rng.choice([{"parameters": params}, {"parameters": junk(rng)}, {"ready": junk(rng)}]))
        else:
            body = compact_json(junk(rng))
        if action == "index":
            path = rng.choice(["/v2/repository/index", "/v2/repository/other/index"])
        else:
            name = odd_name(rng, self.models)
            if self.remote and name in self.served:
                name += "_not_served"
            quoted = urllib.parse.quote(name, safe="")
            repo = rng.choice(["", "other/"])
            path = f"/v2/repository/{repo}models/{quoted}/{action}"
        return HttpCase(f"repository.{action}", "POST", path, body, unavailable_ok=True)
