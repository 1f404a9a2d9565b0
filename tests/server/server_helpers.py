"""Shared by the server tests: the engine run directly (the reference the server must match)."""

from __future__ import annotations


def chat_ids(engine, messages):
    """The prompt ids the server must build for `messages`: the model's template, then encode."""
    tok = engine.tokenizer
    return list(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))


def run_direct(engine, params_cls, prompt_ids, max_tokens, stop=(), **sampling):
    """(text, n_tokens, finish_reason) of engine.generate called in-process, not via HTTP."""
    text, n, finish = "", 0, None
    for ev in engine.generate(list(prompt_ids), params_cls(**sampling), max_tokens, list(stop)):
        text += ev.text or ""
        if ev.token_id is not None:
            n += 1
        if ev.finish_reason:
            finish = ev.finish_reason
            break
    if finish is None:
        finish = "length" if n >= max_tokens else "stop"
    return text, n, finish


def metric_value(text: str, name: str, labels: dict | None = None) -> float:
    """One sample's value from Prometheus text (parsed by prometheus-client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    return 0.0


def wait_healthy(proc, url: str, timeout: float = 600.0) -> None:
    """Poll GET url/health until it answers 200, while the server process `proc` runs (its output
    in the failure otherwise); `timeout` seconds is the hang guard."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "server never became ready"
        try:
            if httpx.get(url + "/health", timeout=30).status_code == 200:
                return
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.1)
