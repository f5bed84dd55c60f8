"""A small in-memory S3 on loopback, good enough for the daemon's state
machine (push, restore, retention, RESTARTS, the startup store check): no
signature check, path-style addressing, one bucket (others answer
NoSuchBucket). Real-Ceph tests stay for everything that touches S3
semantics; this one only lets the engine's tests run in seconds.

Supported: PUT/GET (Range, If-Match)/HEAD/DELETE object, conditional PUT
and CompleteMultipartUpload (If-None-Match: *, If-Match), multipart
(create, part, complete, abort, list uploads), ListObjectsV2 (prefix,
delimiter, max-keys, continuation-token), DeleteObjects.

Hooks for tests: `stall(method, key)` returns seconds to hold a request
before answering (e.g. to keep spotd in its restore); `fail(method, key)`
returns None or (status, code) to answer with that error instead;
`requests` lists (method, key, query) of every request."""
import hashlib
import http.server
import re
import threading
import time
import urllib.parse
import uuid
from xml.sax.saxutils import escape

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _etag(data):
    return '"%s"' % hashlib.md5(data).hexdigest()


class FakeS3:
    def __init__(self, bucket="spot-test"):
        self.bucket = bucket
        self.objects = {}   # key -> (bytes, etag)
        self.uploads = {}   # upload id -> {"key":, "parts": {n: bytes}, "t":}
        self.lock = threading.Lock()
        self.requests = []
        self.stall = lambda method, key: 0
        self.fail = lambda method, key: None
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _serve(self):
                fake._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 64
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def env(self):
        """What spotd and spotctl need to talk to this server."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "fake",
                "AWS_SECRET_ACCESS_KEY": "fake", "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    # ------------------------------------------------------------ replies

    @staticmethod
    def _send(h, status, body=b"", headers=None):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD" and body:
            h.wfile.write(body)

    def _xml(self, h, status, inner):
        body = ('<?xml version="1.0" encoding="UTF-8"?>' + inner).encode()
        self._send(h, status, body, {"Content-Type": "application/xml"})

    def _error(self, h, status, code, msg=""):
        self._xml(h, status, "<Error><Code>%s</Code><Message>%s</Message>"
                  "</Error>" % (code, escape(msg or code)))

    # ----------------------------------------------------------- dispatch

    def _handle(self, h):
        u = urllib.parse.urlsplit(h.path)
        q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))
        parts = u.path.lstrip("/").split("/", 1)
        bucket = urllib.parse.unquote(parts[0])
        key = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        with self.lock:
            self.requests.append((h.command, key, u.query))
        delay = self.stall(h.command, key)
        if delay:
            time.sleep(delay)
        err = self.fail(h.command, key)
        if err:
            return self._error(h, err[0], err[1])
        if bucket != self.bucket:
            return self._error(h, 404, "NoSuchBucket", "The specified bucket "
                               "does not exist")
        with self.lock:
            if not key:
                return self._bucket_op(h, q, body)
            return self._object_op(h, key, q, body)

    def _bucket_op(self, h, q, body):
        if h.command == "GET" and "uploads" in q:
            return self._list_uploads(h, q)
        if h.command == "GET":
            return self._list(h, q)
        if h.command == "POST" and "delete" in q:
            keys = re.findall(r"<Key>(.*?)</Key>", body.decode())
            out = ""
            for k in keys:
                k = k.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
                self.objects.pop(k, None)
                out += "<Deleted><Key>%s</Key></Deleted>" % escape(k)
            return self._xml(h, 200, '<DeleteResult xmlns="%s">%s</DeleteResult>'
                             % (NS, out))
        if h.command == "HEAD":
            return self._send(h, 200)
        return self._error(h, 400, "NotImplemented")

    def _precondition(self, h, key):
        cur = self.objects.get(key)
        if h.headers.get("If-None-Match") == "*" and cur is not None:
            return False
        m = h.headers.get("If-Match")
        if m is not None and m != "*":
            if cur is None or m.strip('"') != cur[1].strip('"'):
                return False
        if m == "*" and cur is None:
            return False
        return True

    def _object_op(self, h, key, q, body):
        if h.command == "PUT" and "uploadId" in q:
            up = self.uploads.get(q["uploadId"])
            if up is None:
                return self._error(h, 404, "NoSuchUpload")
            up["parts"][int(q["partNumber"])] = body
            return self._send(h, 200, b"", {"ETag": _etag(body)})
        if h.command == "PUT":
            if not self._precondition(h, key):
                return self._error(h, 412, "PreconditionFailed")
            self.objects[key] = (body, _etag(body))
            return self._send(h, 200, b"", {"ETag": self.objects[key][1]})
        if h.command == "POST" and "uploads" in q:
            uid = uuid.uuid4().hex
            self.uploads[uid] = {"key": key, "parts": {}, "t": time.time()}
            return self._xml(h, 200, "<InitiateMultipartUploadResult><Bucket>%s"
                             "</Bucket><Key>%s</Key><UploadId>%s</UploadId>"
                             "</InitiateMultipartUploadResult>"
                             % (self.bucket, escape(key), uid))
        if h.command == "POST" and "uploadId" in q:
            return self._complete(h, key, q["uploadId"], body)
        if h.command == "DELETE" and "uploadId" in q:
            if self.uploads.pop(q["uploadId"], None) is None:
                return self._error(h, 404, "NoSuchUpload")
            return self._send(h, 204)
        if h.command == "DELETE":
            self.objects.pop(key, None)
            return self._send(h, 204)
        return self._get(h, key)

    def _complete(self, h, key, uid, body):
        up = self.uploads.get(uid)
        if up is None:
            return self._error(h, 404, "NoSuchUpload")
        if not self._precondition(h, key):
            return self._error(h, 412, "PreconditionFailed")
        nums = [int(x) for x in re.findall(r"<PartNumber>(\d+)</PartNumber>",
                                           body.decode())]
        if any(n not in up["parts"] for n in nums):
            return self._error(h, 400, "InvalidPart")
        data = b"".join(up["parts"][n] for n in nums)
        md5s = b"".join(hashlib.md5(up["parts"][n]).digest() for n in nums)
        etag = '"%s-%d"' % (hashlib.md5(md5s).hexdigest(), len(nums))
        self.objects[key] = (data, etag)
        del self.uploads[uid]
        return self._xml(h, 200, "<CompleteMultipartUploadResult><Key>%s</Key>"
                         "<ETag>%s</ETag></CompleteMultipartUploadResult>"
                         % (escape(key), escape(etag)))

    def _get(self, h, key):
        cur = self.objects.get(key)
        if cur is None:
            return self._error(h, 404, "NoSuchKey", "The specified key does "
                               "not exist.")
        data, etag = cur
        m = h.headers.get("If-Match")
        if m is not None and m.strip('"') != etag.strip('"'):
            return self._error(h, 412, "PreconditionFailed")
        rng = h.headers.get("Range")
        hdr = {"ETag": etag, "Content-Type": "application/octet-stream"}
        if rng:
            a, _, b = rng[len("bytes="):].partition("-")
            a = int(a)
            b = min(int(b), len(data) - 1) if b else len(data) - 1
            hdr["Content-Range"] = "bytes %d-%d/%d" % (a, b, len(data))
            if h.command == "HEAD":
                hdr["Content-Length"] = str(b - a + 1)
            return self._send(h, 206, data[a:b + 1], hdr)
        if h.command == "HEAD":
            hdr["Content-Length"] = str(len(data))
        return self._send(h, 200, data, hdr)

    def _list(self, h, q):
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        maxk = int(q.get("max-keys", "1000") or 1000)
        after = q.get("continuation-token", "")
        keys = sorted(k for k in self.objects if k.startswith(prefix) and k > after)
        out, cps, n, last, trunc = "", [], 0, "", False
        for k in keys:
            if n >= maxk:
                trunc = True
                break
            rest = k[len(prefix):]
            if delim and delim in rest:
                cp = prefix + rest.split(delim, 1)[0] + delim
                if cp not in cps:
                    cps.append(cp)
                    n += 1
                last = k
                continue
            data, etag = self.objects[k]
            out += ("<Contents><Key>%s</Key><LastModified>2026-01-01T00:00:00.000Z"
                    "</LastModified><ETag>%s</ETag><Size>%d</Size></Contents>"
                    % (escape(k), escape(etag), len(data)))
            n += 1
            last = k
        out += "".join("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>"
                       % escape(c) for c in cps)
        tail = ("<IsTruncated>true</IsTruncated><NextContinuationToken>%s"
                "</NextContinuationToken>" % escape(last)) if trunc else \
            "<IsTruncated>false</IsTruncated>"
        return self._xml(h, 200, '<ListBucketResult xmlns="%s"><Name>%s</Name>'
                         "<Prefix>%s</Prefix><KeyCount>%d</KeyCount>%s%s"
                         "</ListBucketResult>" % (NS, self.bucket, escape(prefix),
                                                  n, out, tail))

    def _list_uploads(self, h, q):
        prefix = q.get("prefix", "")
        out = "".join(
            "<Upload><Key>%s</Key><UploadId>%s</UploadId><Initiated>%s</Initiated>"
            "</Upload>" % (escape(u["key"]), uid,
                           time.strftime("%Y-%m-%dT%H:%M:%S.000Z",
                                         time.gmtime(u["t"])))
            for uid, u in sorted(self.uploads.items())
            if u["key"].startswith(prefix))
        return self._xml(h, 200, '<ListMultipartUploadsResult xmlns="%s"><Bucket>'
                         "%s</Bucket>%s<IsTruncated>false</IsTruncated>"
                         "</ListMultipartUploadsResult>" % (NS, self.bucket, out))
