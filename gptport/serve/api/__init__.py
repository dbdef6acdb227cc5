"""The OpenAI API's request side and formats: fields, checks, typed jobs, chat templates, and the chat
and completions answers."""
