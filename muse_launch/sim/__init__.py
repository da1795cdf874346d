"""Rehearsal engine: a stand-in for SGLang / vLLM workers that needs no GPU.

    python -m muse_launch.sim --engine sglang|vllm [--ready-after S] [--state-dir DIR]
                              [--kv-timeout S] [--itl S] [--loopback] -- <engine args>

``--ready-after`` (2.0): /health and /health_generate answer 503 until this long after start
(and, on a multi-node role, until every node joined).  ``--state-dir``: where the local model
dir is made; by default ``$MUSE_LAUNCH_RUN_DIR/sim/$MUSE_LAUNCH_ROLE`` when muse-launch started it (nothing
left in /tmp even after SIGKILL), else a temp dir removed at exit.  ``--kv-timeout`` (3.0):
how long a KV hand-off waits for the other side.  ``--itl`` (0.002): delay between streamed
chunks.  ``--loopback``: bind every listener on 127.0.0.1 whatever ``--host`` says.

``<engine args>`` are exactly what the real engine receives after ``sglang serve`` (or
``python -m sglang.launch_server``) / ``vllm serve`` (first positional = model) or
``python -m vllm.entrypoints.openai.api_server`` (``--model M``).  Unknown flags are
ignored; flags the real parser would reject (bad choices, bad JSON) exit 2; start-up rules
the real engine enforces (``--encoder-only`` with ``--language-only``, a connector without
``kv_role``, ...) exit 1.  Every port the real engine binds is bound (HTTP; SGLang prefill KV
bootstrap; SGLang language-only encoder bootstrap; vLLM NIXL side channel / Mooncake
bootstrap; multi-node dist-init on node 0); a busy one is logged with its purpose and the
process exits 1.  The router's HTTP/2 (gRPC) probe is logged as one line, not a traceback.
SIGTERM/SIGINT: exit 0 within ~50 ms.  One log line per event on stdout.

Wiring that really happens over loopback sockets (a mistake fails as it would on GPUs):

* SGLang prefill/decode: the decode connects to ``bootstrap_host:bootstrap_port`` from each
  request and long-polls the room; the prefill holds its answer until a decode fetched the
  room.  Wrong bootstrap port -> decode answers HTTP 500 naming the address and room; the
  prefill times out (``--kv-timeout``) and answers 500 too.  Decode checks model, transfer
  backend and (when both set) KV-cache dtype and page size against the prefill.
* SGLang EPD (as SGLang 0.5.23, see :mod:`muse_launch.sim.encoders`): a ``--language-only``
  worker binds ``--encoder-bootstrap-port`` at once, is healthy without any encoder, probes
  its ``--encoder-urls`` in the background (every 10 s, ``MUSE_SIM_ENCODER_PROBE_INTERVAL``
  for tests; 3 failures evict, a healthy probe re-adds) and lists the live set at
  ``GET :<encoder-bootstrap-port>/list_encoder_urls``.  Media parts of a chat request go to
  the listed encoders, which deliver back to that port; none listed -> processed locally with a
  warning; a listed encoder unreachable -> 502.  ``--encoder-register-urls`` on an encoder
  registers it with language workers once loaded.
* vLLM: see :mod:`muse_launch.sim.transfer` (NIXL side channel, Mooncake bootstrap,
  ExampleConnector shared directory).  The NIXL side channel listens once per local DP rank,
  at ``VLLM_NIXL_SIDE_CHANNEL_PORT`` + the global DP rank.
* Multi-node: node 0 listens on the dist-init address (SGLang ``--dist-init-addr``; vLLM
  ``--master-addr/--master-port`` with ``--nnodes``, or for DP across nodes
  ``--data-parallel-address/--data-parallel-rpc-port``, node rank = ``--data-parallel-start-rank``
  / ``--data-parallel-size-local``); the other nodes join it, and none is ready before all have.
  vLLM ``--headless`` ranks serve no HTTP; with ``--data-parallel-hybrid-lb`` (or
  ``-external-lb``) every node serves its own API.

Workers report a tiny local directory (``<state-dir>/sim-models/<model>``: config.json and a
valid WordLevel tokenizer.json) as ``model_path``/``tokenizer_path``, and the real model
name as ``served_model_name``, so a router never downloads anything and ``/v1/models`` on
the router shows the served name.

What the real routers send (observed against these sims and a capture server)
-----------------------------------------------------------------------------

sglang-router 0.3.2 (``launch --pd-disaggregation --prefill URL PORT --decode URL``):

* start-up: tries gRPC (HTTP/2 prior-knowledge preface) first, falls back to HTTP/1.1;
  ``GET /health`` retried while refused or 503; then ``GET /server_info`` and
  ``GET /model_info``.  Worker model id = ``served_model_name`` from ``/server_info`` (else
  ``model_path``); it loads a tokenizer from the reported ``tokenizer_path``/``model_path``
  ("Successfully registered tokenizer" with the local dir; a dir without tokenizer files
  only gives a WARN).  ``GET /v1/models`` on the router lists the served name.
* per request: the same path and body to prefill and decode at once, plus
  ``bootstrap_host`` (host of the prefill URL), ``bootstrap_port`` (as configured) and
  ``bootstrap_room`` (random u63, identical for both halves).  Chat ``max_tokens`` arrives
  as ``max_completion_tokens``; it adds ``separate_reasoning``, ``stream_reasoning``,
  ``no_stop_trim``, ``skip_special_tokens``, ``return_hidden_states`` ... fields.
* a decode 500 is retried (5 attempts by default, new room each time) and counted by the
  circuit breaker (10 failures -> 503 ``No available prefill workers``).  After the last
  attempt the client gets HTTP 500 ``{"error": {"code": "decode_internal_error",
  "message": <the decode's "message">}}``; for ``stream: true`` a 500 whose body embeds the
  decode's error JSON.  With the default 3 s ``--kv-timeout`` a wrong bootstrap port costs
  the client ~15 s; tests use 0.5 s (~3 s).

vllm-router 0.1.17 (``--vllm-pd-disaggregation --prefill URL [PORT] --decode URL``):

* start-up: ``GET /health`` and ``GET /metrics`` on each worker (parses
  ``vllm:*{engine="N"}`` to count DP engines, else assumes 1); the router binds its own port
  only after the workers are healthy.  It never calls ``/server_info`` or ``/v1/models``.
* per request, sequentially (prefill first, then decode), header
  ``X-Request-ID: ___prefill_addr_H:P___decode_addr_H:P_<uuid>``:
  prefill gets the body with ``stream: false``, ``max_tokens: 1`` (and
  ``max_completion_tokens: 1`` if present), ``min_tokens: 1``, no ``stream_options``, and
  ``kv_transfer_params``; decode gets the original body plus ``kv_transfer_params``.
* ``--kv-connector nixl`` (default): prefill ``kv_transfer_params`` =
  ``{do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null,
  remote_block_ids: null, remote_host: null, remote_port: null}``; the decode receives the
  prefill response's ``kv_transfer_params`` object verbatim (extra keys pass through; a
  ``null`` passes as ``null``, which is what ExampleConnector yields).
* ``--kv-connector mooncake``: at start-up ``GET http://<prefill host>:<PORT or 8998>/query``
  (30 retries, backoff to 10 s) expecting ``{"<dp_rank>": {"engine_id": ...}}``; per request
  prefill gets ``{do_remote_decode: true, do_remote_prefill: false, transfer_id:
  "xfer-<uuid>"}`` and decode ``{do_remote_decode: false, do_remote_prefill: true,
  transfer_id, remote_bootstrap_addr: "http://host:port", remote_engine_id}``.
* ``/v1/chat/completions``, ``/v1/completions`` and ``/generate`` are all proxied this way.
"""
