"""OpenAI's API (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``) over the repository's LLMs.

The mapping is pure and follows Triton's OpenAI front end: ``params`` reads a
request body, ``conventions`` turns it into an inference request for a model
that follows Triton's LLM conventions (vLLM's or TensorRT-LLM's inputs),
``chat_template`` renders chat messages to a prompt, and ``answers`` builds the
JSON and Server-Sent Events the client reads.  ``app`` is the thin Starlette
front end; the requests go through :class:`~serve_app.service.InferenceService`
as every other request does, so statistics and metrics count them.
"""
