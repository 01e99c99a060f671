"""ELMo behind a socket (`elmo-jax serve`): the ASGI app (`app`), its two protocols (`v2`: the Open Inference
Protocol; `openai_api`: `/v1/embeddings`), dynamic batching (`batcher`), metrics (`metrics`) and uvicorn's server
with a drain (`server`). Needs the `serve` extra; nothing else in elmo_jax imports this room."""
