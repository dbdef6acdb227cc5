"""POST /v1/responses (OpenAI's Responses API, stateless) translated onto the chat path and back."""
