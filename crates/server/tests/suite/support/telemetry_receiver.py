"""A real OTLP/gRPC trace receiver, plus a plain HTTP upstream, for sluice's telemetry test.

The receiver is the TraceService of the `opentelemetry-proto` PyPI package served by `grpcio`:
every exported span is appended to OUT/spans.jsonl as one JSON object (ids in hex, attributes
as a dict), and every request's bytes to OUT/raw.bin, so the test can search them for a
credential. The upstream (the standard library's HTTP server) appends the path and the
`traceparent` it received to OUT/upstream.jsonl and answers 200.

Usage: python telemetry_receiver.py OUT. Prints "PORTS <grpc> <http>" once both listen on
127.0.0.1, and exits when its parent (the test) is gone.
"""

import json
import os
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

OUT = sys.argv[1]
LOCK = threading.Lock()


def append(name, data):
    with LOCK, open(os.path.join(OUT, name), "ab") as f:
        f.write(data)


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        append("raw.bin", request.SerializeToString())
        lines = []
        for rs in request.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "flags": s.flags,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "status": s.status.code,
                        "scope": ss.scope.name,
                        "resource": resource,
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                    }))
        append("spans.jsonl", "".join(line + "\n" for line in lines).encode())
        return trace_service_pb2.ExportTraceServiceResponse()


class Upstream(BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        record = {"path": self.path, "traceparent": self.headers.get("traceparent")}
        append("upstream.jsonl", (json.dumps(record) + "\n").encode())
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = answer
    do_POST = answer

    def log_message(self, *args):
        pass


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    print(f"PORTS {grpc_port} {http.server_address[1]}", flush=True)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    main()
