"""A stand-in for openvino_genai in tests: LLMPipeline answers the prompt's last id + 1, 2, ... and reports
perf_metrics. FAKE_OV_MODE=crash makes generate() kill the process."""

import os
import types

__version__ = "0.0-fake"


class GenerationConfig:
    max_new_tokens = 0
    do_sample = False
    num_assistant_tokens = 0
    max_ngram_size = 0
    stop_token_ids = set()


class TokenizedInputs:
    def __init__(self, input_ids, attention_mask):
        self.input_ids = input_ids


def draft_model(path, device, **kwargs):
    return ("draft", path)


class LLMPipeline:
    def __init__(self, path, device, **kwargs):
        if not os.path.isdir(path):
            raise RuntimeError(f"no model at {path}")
        self.kwargs = kwargs

    def generate(self, inputs, cfg):
        if os.environ.get("FAKE_OV_MODE") == "crash":
            os._exit(9)
        last = int(inputs.input_ids.data[0][-1])
        tokens = [last + i + 1 for i in range(cfg.max_new_tokens)]
        stat = lambda v: types.SimpleNamespace(mean=v)  # noqa: E731
        metrics = types.SimpleNamespace(get_ttft=lambda: stat(7.0),
                                        get_generate_duration=lambda: stat(7.0 + 20.0 * (len(tokens) - 1)))
        return types.SimpleNamespace(tokens=[tokens], perf_metrics=metrics)
