"""The Starlette app of the OpenAI port: decode, call the service, encode (the mapping lives beside it).

Every error answers in OpenAI's shape with the status of
:mod:`serve_app.protocol.status`; an error after a stream has started
travels as one ``data: {"error": ...}`` event before ``data: [DONE]``.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from serve_app.errors import InvalidArgument, NotFound, ServeError, as_serve_error
from serve_app.http_server.app import read_body
from serve_app.inference.types import StreamItem
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.openai_api import chat_template
from serve_app.openai_api.answers import DONE, Answer, error_for, error_json, event, model_entry
from serve_app.openai_api.conventions import convention, infer_request, read_response
from serve_app.openai_api.params import Params, chat_params, completion_params, parse_body
from serve_app.protocol.status import http_status
from serve_app.service import InferenceService, ModelState, ServedModel

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"
TOKENIZER_PARAMETER = "tokenizer"  # a model's config parameter naming its tokenizer directory


def _json(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status_code=status, media_type=JSON)


def _error(exc: BaseException) -> Response:
    err = as_serve_error(exc)
    status = http_status(err.code)
    return _json(error_for(err, status), status)


async def _routing_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    return _json(error_json(status, exc.detail if isinstance(exc, HTTPException) else str(exc)), status)


def build_openai_app(
    service: InferenceService,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    tokenizer: str = "",
    model_repository: str = "",
) -> Starlette:
    """``tokenizer``: the chat template's directory for models whose config names none; ``model_repository``:
    where a model's relative ``tokenizer`` parameter is found."""
    created = int(time.time())
    owner = service.server_metadata().name

    def llm_models() -> list[ServedModel]:
        newest: dict[str, ServedModel] = {}
        for m in service.registry.all_models():  # in version order: the newest wins
            if m.state is ModelState.READY and convention(m.signature) is not None:
                newest[m.name] = m
        return list(newest.values())

    def llm_model(name: str) -> ServedModel:
        model = service.model(name)
        if convention(model.signature) is None:
            raise InvalidArgument(
                f"model '{name}' does not follow Triton's LLM conventions (a text_input input with "
                "sampling_parameters or max_tokens, and a text_output output)"
            )
        return model

    def prompt_of(model: ServedModel, params: Params) -> str:
        directory = tokenizer
        parameter = model.config.parameters.get(TOKENIZER_PARAMETER)
        if parameter is not None and parameter.string_value:
            directory = str(pathlib.Path(model_repository, model.name) / parameter.string_value)
        if not directory:
            return chat_template.default_prompt(params.messages)
        return chat_template.render(directory, params.messages)

    async def list_models(request: Request) -> Response:
        data = [model_entry(m.name, created, owner) for m in llm_models()]
        return _json({"object": "list", "data": data})

    async def retrieve_model(request: Request) -> Response:
        name = request.path_params["model"]
        if all(m.name != name for m in llm_models()):
            raise NotFound(f"The model `{name}` does not exist")
        return _json(model_entry(name, created, owner))

    async def completions(request: Request) -> Response:
        params = completion_params(parse_body(await read_body(request, limits)))
        model = llm_model(params.model)
        return await answer(model, params, params.prompt, Answer(False, params.model, params.max_tokens))

    async def chat(request: Request) -> Response:
        params = chat_params(parse_body(await read_body(request, limits)))
        model = llm_model(params.model)
        return await answer(model, params, prompt_of(model, params), Answer(True, params.model, params.max_tokens))

    async def answer(model: ServedModel, params: Params, prompt: str, out: Answer) -> Response:
        out.include_usage = params.include_usage
        items = service.infer_stream(model, infer_request(model.signature, params, prompt, request_id=out.id))
        if not params.stream:
            pieces = []
            async with contextlib.aclosing(items):
                async for item in items:
                    if item.error is not None:
                        raise item.error
                    if item.response is not None:
                        pieces.append(read_response(item.response))
            return _json(out.unary(pieces))
        try:  # an error before the first response answers with its own status
            first = await anext(items, None)
            if first is not None and first.error is not None:
                raise first.error
        except BaseException:
            await items.aclose()
            raise
        return StreamingResponse(_events(out, first, items), media_type=SSE)

    routes = [
        Route("/v1/models", guarded(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(retrieve_model), methods=["GET"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})


def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return _error(exc)

    return run


async def _events(
    out: Answer, first: StreamItem | None, items: AsyncGenerator[StreamItem, None]
) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(items):
        for opening in out.opening():
            yield opening
        item = first
        while item is not None:
            try:
                if item.error is not None:
                    raise item.error
                chunk = out.chunk(read_response(item.response)) if item.response is not None else None
            except ServeError as exc:
                yield event(error_for(exc, http_status(exc.code)))
                yield DONE
                return
            if chunk is not None:
                yield chunk
            if item.final:
                break
            item = await anext(items, None)
        for closing in out.closing():
            yield closing
