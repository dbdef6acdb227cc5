"""Serving: the OpenAI-compatible HTTP server over the batching engine (engine/). By role: api/ reads requests
into typed jobs and writes OpenAI's answers (api/responses/ the Responses API on the chat path); the model
host (settings.py, model_host.py, companions.py, startup.py, metrics.py) opens the model and its scheduler;
http/ is the HTTP surface (the app's wiring, its routes, uvicorn); ray/ runs it on Ray Serve."""
