wrk.method = "POST"
wrk.body   = '{"model": "dummy", "input": ["hello world this is a query"], "encoding_format": "base64"}'
wrk.headers["Content-Type"] = "application/json"
