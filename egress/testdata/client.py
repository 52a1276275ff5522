"""A Python application that knows nothing of tokentap: the standard
library's urllib, configured only by the environment (HTTPS_PROXY, and
SSL_CERT_FILE for the CA). It streams one chat completion and writes the
bytes it received to stdout, exactly as read."""

import os
import sys
import urllib.request

url = sys.argv[1]
body = sys.argv[2].encode()
req = urllib.request.Request(
    url,
    data=body,
    method="POST",
    headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + os.environ.get("TEST_API_KEY", ""),
    },
)
# urlopen takes the proxy from HTTPS_PROXY (CONNECT) and verifies the
# server against the default paths, which SSL_CERT_FILE sets.
with urllib.request.urlopen(req, timeout=30) as resp:
    out = sys.stdout.buffer
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        out.write(chunk)
        out.flush()
