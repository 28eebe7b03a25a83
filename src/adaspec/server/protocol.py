"""Request and response shapes of the OpenAI-compatible API (pydantic), and OpenAI-style errors.

Requests follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` bodies. Unknown fields are rejected
(as OpenAI does), and OpenAI fields adaspec cannot honour (``suffix``, ``best_of``, ``functions``, ...) are
accepted only at their neutral value, so a client never gets silently different behaviour. Structured output
(``response_format`` ``json_object`` / ``json_schema``) and tool calls (``tools``, ``tool_choice``) are compiled by
:mod:`adaspec.server.structured`. Extensions:

* ``speculation``: ``{"drafter": ..., "controller": ..., "k": ...}``, this request's speculation settings
  (server-side defaults for what is left out);
* ``top_k``, ``min_p``, ``repetition_penalty`` and ``ignore_eos`` (as in vLLM).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, field_validator, model_validator

# --------------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------------


class APIError(Exception):
    """An error answered to the client with an OpenAI-style body::

        {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# --------------------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------------------

MAX_STOP = 16
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI chat allows 20)
MAX_LOGIT_BIAS = 1024
MAX_N = 8  # choices per request
MAX_STOP_CHARS = 256
MAX_TOKENS_CAP = 1 << 31  # anything above is rejected by validation; the real limit is checked per model

StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_CHARS)]


class SpeculationOptions(BaseModel):
    """Per-request speculation settings (adaspec extension). Missing fields take the server's defaults."""

    model_config = ConfigDict(extra="forbid")

    drafter: str | None = Field(
        None, max_length=200,
        description="'none' (plain decoding), 'ngram', 'suffix', 'layerskip:N', 'hybrid', 'A+B', or a draft model the "
                    "server has loaded")
    controller: Literal["goodput", "adaptive", "heuristic", "fixed", "confidence", "entropy", "bandit"] | None = Field(
        None, description="draft-length controller (see adaspec.controllers.CONTROLLERS)")
    k: int | None = Field(None, ge=0, le=32, description="fixed K, or the initial K of adaptive/heuristic")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


def _neutral(name: str, value: Any, neutral: tuple) -> Any:
    if value not in neutral and not (isinstance(value, (dict, list)) and not value):
        raise ValueError(f"{name} is not supported by adaspec; leave it out (or set it to {neutral[0]!r})")
    return value


class _CommonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, max_length=256, description="the served model's name (default: that model)")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP, description="tokens to generate at most")
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1, le=1 << 20, description="extension: keep the k most likely tokens (0 or -1: off)")
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description=f"number of choices (1 to {MAX_N})")
    user: str | None = Field(None, max_length=256)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False,
                                    description="OpenAI: subtracted once from the logit of every generated token")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False,
                                     description="OpenAI: subtracted per occurrence in the generated tokens")
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, allow_inf_nan=False,
                                      description="extension (vLLM, Hugging Face): > 1 discourages tokens of the "
                                                  "prompt and output")
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False,
                         description="extension (vLLM): keep tokens with probability >= min_p x the top token's")
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100]")
    ignore_eos: bool = Field(False, description="extension: keep generating past end-of-sequence tokens")
    strict: bool | None = Field(None, description="extension: strict mode (batch-invariant target): greedy output "
                                "equals plain decoding and a repeated greedy request gives the same text (default: the "
                                "server's --strict)")
    speculation: SpeculationOptions | None = Field(None, description="extension: speculation settings")

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if not 1 <= v <= MAX_N:
            raise ValueError(f"n={v} is out of range: this server returns 1 to {MAX_N} choices per request")
        return v


    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(v)} entries; at most {MAX_LOGIT_BIAS}")
        for key, bias in v.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 12):
                raise ValueError(f"logit_bias keys are token ids (non-negative integers), got {key[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias[{key}] = {bias} is outside [-100, 100]")
        return v

    @property
    def token_bias(self) -> dict[int, float] | None:
        return {int(k): float(b) for k, b in self.logit_bias.items()} if self.logit_bias else None

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(_CommonRequest):
    """``POST /v1/completions``: a raw prompt (no chat template)."""

    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[
        list[TokenIds], Field(min_length=1)] = Field(..., description="a string, or a list of token ids")
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_CAP,
                                   description="tokens to generate at most (0 only with echo: score the prompt)")
    echo: bool = Field(False, description="return the prompt before the completion (with logprobs: its tokens' "
                                          "log-probabilities)")
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="log-probabilities of each token and this many top alternatives")

    @field_validator("suffix")
    @classmethod
    def _none_only(cls, v, info):
        return _neutral(info.field_name, v, (None,))

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens=0 is only allowed with echo=true (to score the prompt)")
        return self

    @property
    def want_logprobs(self) -> int | None:
        """Top alternatives per token to return (0: the chosen token's only), or None: no logprobs."""
        return self.logprobs

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v, info):
        return _neutral(info.field_name, v, (None, 1))

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"batched prompts are not supported ({len(v)} prompts given); send one request "
                                 "per prompt")
            return v[0]
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    # Fields clients echo back from earlier responses; accepted while empty.
    refusal: str | None = None
    tool_calls: list[Any] | None = None  # an assistant's earlier calls (rendered by the chat template)
    function_call: Any | None = None
    audio: Any | None = None
    tool_call_id: str | None = None

    @field_validator("function_call", "audio")
    @classmethod
    def _empty(cls, v, info):
        return _neutral(info.field_name, v, (None,))

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def as_template_message(self) -> dict:
        role = "system" if self.role == "developer" else self.role
        out = {"role": role, "content": self.text}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class JsonSchemaFormat(BaseModel):
    """OpenAI ``response_format.json_schema``: the schema the output follows (``strict``: unsupported keywords are
    errors; default true here, as structured output is exact or refused)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class ChatCompletionRequest(_CommonRequest):
    """``POST /v1/chat/completions``: messages rendered with the model's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=4096)]
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP, description="alias of max_tokens")
    logprobs: bool | None = Field(None, description="return the log-probability of each generated token")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                     description="with logprobs: this many most likely alternatives per token")
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = None
    tool_choice: Any | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    _structured: Any = PrivateAttr(default=None)  # its StructuredPlan, set by the server (adaspec.server.structured)

    @field_validator("functions")
    @classmethod
    def _none_only(cls, v, info):
        return _neutral(info.field_name, v, (None,))

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def echo(self) -> bool:
        return False

    @property
    def want_logprobs(self) -> int | None:
        """Top alternatives per token to return (0: the chosen token's only), or None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _max_tokens_alias(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError(f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                                 f"({self.max_completion_tokens}) disagree; give one of them")
            self.max_tokens = self.max_completion_tokens
        return self
