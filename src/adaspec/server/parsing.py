"""From a validated request body to what a generation needs: the engine of its speculation setting, the prompt's
token ids (encoded on the host's encode thread) and its :class:`~adaspec.engine.GenerationConfig`. Everything here
answers a bad request with a 4xx :class:`~adaspec.server.protocol.APIError` naming the field, before the request
takes a place in the queue."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from fastapi import Request

from adaspec.engine import GenerationConfig
from adaspec.errors import AdaspecError, ConfigError
from adaspec.server.auth import KEY_ID_STATE
from adaspec.server.host import ModelHost
from adaspec.server.jobs import EngineHandle
from adaspec.server.limits import ScoringBudget, refuse_lone_surrogates
from adaspec.server.protocol import APIError
from adaspec.server.settings import ServerConfig
from adaspec.server.structured import StructuredPlan, compile_request, plan_request, template_messages
from adaspec.server.suffix_partitions import suffix_partition

SAMPLING_EPS = 1e-5  # temperatures below this mean greedy


class RequestParser:
    """Parses requests for ``host`` under ``config``.

    Args:
        host: the loaded models.
        config: the server's settings (default and largest ``max_tokens``, strict mode, suffix sharing).
        names: the names accepted as ``model``; ``served`` is the one error messages give.
        budget: the prompt-scoring budget (``echo`` + ``logprobs``); ``score_chunk`` positions are scored per
            forward.
    """

    def __init__(self, host: ModelHost, config: ServerConfig, names: set[str], served: str, budget: ScoringBudget,
                 score_chunk: int) -> None:
        self.host, self.config, self.names, self.served = host, config, names, served
        self.budget, self.score_chunk = budget, score_chunk
        self.limit = min(config.max_tokens_limit or host.max_context, host.max_context)  # largest max_tokens

    def check_model(self, name: str | None) -> None:
        """Raises APIError (404) when ``name`` is given and not a name of the served model."""
        if name is not None and name not in self.names:
            raise APIError(404, f"the model {name!r} does not exist on this server; it serves {self.served!r}",
                           param="model", code="model_not_found")

    def resolve_settings(self, body) -> EngineHandle:
        """The engine of the request's ``speculation`` (the server's default without one)."""
        host = self.host
        opts = body.speculation
        try:
            settings = host.normalise(opts.drafter, opts.controller, opts.k) if opts else host.default
        except ConfigError as e:
            raise APIError(400, str(e), param="speculation") from None
        return host.engine_for(settings)

    async def encode(self, body, chat: bool) -> list[int]:
        """The prompt's token ids (chat: the messages through the chat template), never empty."""
        host = self.host
        loop = asyncio.get_running_loop()
        try:
            if chat:
                messages = template_messages([m.as_template_message() for m in body.messages])
                tools = body._structured.tools.template_tools if body._structured.tools else None
                ids = await loop.run_in_executor(host.encode_executor, host.encode_chat, messages, tools)
            elif isinstance(body.prompt, str):
                ids = await loop.run_in_executor(host.encode_executor, host.encode_text, body.prompt)
            else:
                vocab = host.vocab_size
                bad = [t for t in body.prompt if t >= vocab]
                if bad:
                    raise APIError(400, f"prompt token id {bad[0]} is out of range: this model's vocabulary has "
                                        f"{vocab} ids", param="prompt")
                ids = list(body.prompt)
        except APIError:
            raise
        except AdaspecError as e:
            raise APIError(400, str(e), param="messages" if chat else "prompt") from None
        except Exception as e:  # e.g. jinja2 TemplateError from a chat template
            if type(e).__module__.startswith("jinja2"):
                raise APIError(400, f"the chat template rejected these messages: {e}", param="messages") from None
            raise
        if not ids:
            raise APIError(400, "the prompt is empty (no tokens)", param="messages" if chat else "prompt")
        return ids

    def generation_config(self, body, prompt_len: int, chat: bool) -> GenerationConfig:
        """The request's sampling settings for a prompt of ``prompt_len`` tokens (``max_tokens`` checked against
        the context window and the server's limit)."""
        host, config, limit = self.host, self.config, self.limit
        ctx = host.max_context
        param = "messages" if chat else "prompt"
        if prompt_len >= ctx:
            raise APIError(400, f"this model's maximum context length is {ctx} tokens, but the prompt has "
                                f"{prompt_len} tokens; shorten it to at most {ctx - 1}", param=param,
                           code="context_length_exceeded")
        if body.max_tokens is None:
            max_tokens = max(1, min(config.default_max_tokens, limit, ctx - prompt_len))
        else:
            max_tokens = max(1, body.max_tokens)  # 0 (echo: score the prompt) still runs the prefill's token
            if max_tokens > limit:
                raise APIError(400, f"max_tokens={max_tokens} exceeds this server's limit of {limit}",
                               param="max_tokens")
            if prompt_len + max_tokens > ctx:
                raise APIError(400, f"this model's maximum context length is {ctx} tokens; you requested "
                                    f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} "
                                    f"in the completion); reduce the prompt or max_tokens", param="max_tokens",
                               code="context_length_exceeded")
        seed = body.seed % (1 << 64) if body.seed is not None else None
        # Like vLLM, temperatures this close to 0 mean greedy (dividing logits by them overflows to inf/NaN).
        temperature = body.temperature if body.temperature >= SAMPLING_EPS else 0.0
        want = body.want_logprobs
        try:
            cfg = GenerationConfig(max_new_tokens=max_tokens, temperature=temperature, top_p=body.top_p,
                                   top_k=max(0, body.top_k), seed=seed, stop=body.stop_list,
                                   ignore_eos=body.ignore_eos,
                                   strict=body.strict if body.strict is not None else (config.strict or None),
                                   repetition_penalty=body.repetition_penalty,
                                   presence_penalty=body.presence_penalty,
                                   frequency_penalty=body.frequency_penalty, logit_bias=body.token_bias,
                                   min_p=body.min_p, logprobs=want,
                                   prompt_logprobs=want if body.echo and want is not None else None,
                                   prompt_logprobs_chunk=self.score_chunk)
        except ConfigError as e:
            raise APIError(400, str(e)) from None
        try:
            host.check_config(cfg)  # what the engine would refuse once the request ran
        except ConfigError as e:
            raise APIError(400, str(e), param="logit_bias") from None
        if body.echo and want is not None:
            self.budget.check(prompt_len)
        return cfg

    async def prepare(self, request: Request, body, chat: bool):
        """``(arrival, handle, ids, cfg)``: the arrival time (``time.monotonic()``), the engine, the prompt's ids
        and the generation config (its suffix-cache partition and compiled grammar set)."""
        host = self.host
        arrival = time.monotonic()
        refuse_lone_surrogates(body)
        self.check_model(body.model)
        handle = self.resolve_settings(body)
        plan = plan_request(body) if chat else StructuredPlan()
        if chat:
            body._structured = plan
        ids = await self.encode(body, chat)
        cfg = self.generation_config(body, len(ids), chat)
        key = None if self.config.suffix_share else getattr(request.state, KEY_ID_STATE, None)
        cfg = dataclasses.replace(cfg, cache_partition=suffix_partition(key))
        if plan.constraint is not None:  # compiled before the request takes a place (400 on a bad grammar)
            await asyncio.get_running_loop().run_in_executor(host.encode_executor, compile_request, host, handle,
                                                             plan)
            cfg = dataclasses.replace(cfg, response_format=plan.constraint)
        return arrival, handle, ids, cfg
