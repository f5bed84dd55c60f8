#!/usr/bin/python3
"""A loopback S3 stand-in that accepts and discards every body: the
ceiling of the push pipeline without a storage server (read, filter,
compress, CRC32C, HTTP over loopback). It answers just what `spotctl push`
needs: HEAD/GET -> 404 (no manifest, no LATEST), PUT -> 200 + ETag,
POST ?uploads -> an upload id, POST ?uploadId -> complete, GET ?uploads and
?list-type=2 -> empty lists. Not an S3 server: no signature check, nothing
stored. Prints the port on stdout, then serves until killed.

usage: s3_discard.py [PORT]   (0 or nothing: a free port)"""
import http.server
import socketserver
import sys
import uuid

BUF = bytearray(4 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _drain(self):
        n = int(self.headers.get("Content-Length") or 0)
        view = memoryview(BUF)
        while n > 0:
            got = self.rfile.readinto(view[:min(n, len(BUF))])
            if not got:
                break
            n -= got

    def _reply(self, code, body=b"", etag=None):
        self.send_response(code)
        if etag:
            self.send_header("ETag", '"%s"' % etag)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self._reply(404)

    def do_GET(self):
        q = self.path.partition("?")[2]
        if "uploads" in q:
            self._reply(200, b'<?xml version="1.0" encoding="UTF-8"?>'
                        b"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                        b"</ListMultipartUploadsResult>")
        elif "list-type=2" in q:
            self._reply(200, b'<?xml version="1.0" encoding="UTF-8"?>'
                        b"<ListBucketResult><IsTruncated>false</IsTruncated>"
                        b"<KeyCount>0</KeyCount></ListBucketResult>")
        else:
            self._reply(404, b"<Error><Code>NoSuchKey</Code></Error>")

    def do_PUT(self):
        self._drain()
        self._reply(200, etag=uuid.uuid4().hex)

    def do_POST(self):
        self._drain()
        q = self.path.partition("?")[2]
        if q.startswith("uploads"):
            body = ("<InitiateMultipartUploadResult><UploadId>%s</UploadId>"
                    "</InitiateMultipartUploadResult>" % uuid.uuid4().hex).encode()
        else:
            body = ("<CompleteMultipartUploadResult><ETag>\"%s-1\"</ETag>"
                    "</CompleteMultipartUploadResult>" % uuid.uuid4().hex).encode()
        self._reply(200, body)

    def do_DELETE(self):
        self._reply(204)


class Server(socketserver.ForkingMixIn, http.server.HTTPServer):
    # a process per connection: no GIL between the transfers in flight
    request_queue_size = 128
    max_children = 256


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    srv = Server(("127.0.0.1", port), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
