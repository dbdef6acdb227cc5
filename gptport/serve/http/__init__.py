"""The HTTP surface: the Starlette app and its routes, errors, CORS, the guard, the access log, uvicorn."""
