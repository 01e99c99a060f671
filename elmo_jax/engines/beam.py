"""ELMo in Apache Beam: a `ModelHandler` for `RunInference` (Dataflow on Google Cloud, Flink, Spark, or the
in-process runner). Beam loads the model once per worker process (or once per machine with `large_model=True`,
shared between its processes), batches the elements within the Embedder's warm shapes, and runs each batch
through it. Needs the beam extra (`pip install 'elmo_jax[beam]'`, in an environment of its own: Beam pins older
pyarrow and protobuf than the training stack's lock).

    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from elmo_jax.engines.beam import ElmoModelHandler

    with beam.Pipeline() as p:
      (p | beam.io.ReadFromText("corpus/*.txt")
         | RunInference(ElmoModelHandler("small", output="average", sentence_vectors=True))
         | beam.Map(lambda result: (result.example, result.inference.tolist()))
         | beam.io.WriteToText("vectors"))

An element is a line (whitespace-tokenized, or raw text with `tokenize=True`) or a list of tokens; its result
is a `PredictionResult(example, inference)`, `inference` the chosen output (`worker.output_format`) as a numpy
array, cut by the embed command's own `parts.line_output`.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from apache_beam.ml.inference.base import ModelHandler
from apache_beam.ml.inference.base import PredictionResult

from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding.embedder import DEFAULT_BATCH_SIZE, Embedder
from elmo_jax.engines import worker

Element = str | Sequence[str]


class ElmoModelHandler(ModelHandler[Element, PredictionResult, Embedder]):
  """`RunInference`'s handler of an ELMo model.

  Args:
    model: any spec `elmo-jax embed --model` takes (a released name, hf://, a folder, a run).
    output: `layers`, `top`, `average` or `mix` (`worker.output_format`).
    mix: with `output="mix"`, one weight per layer.
    sentence_vectors: the mean of the output over the tokens instead.
    dtype: float32 or float16.
    tokenize: tokenize raw text with the trainer's Moses tokenizer.
    batch_size: the most elements Beam puts in one batch (default: the Embedder's batch, 64 per device, so a
      batch is one device batch of a warm shape).
    large_model: load one model per machine and share it between the worker's processes.
    warm: compile every shape at load (a long-running streaming job); False compiles each when first met.
  """

  def __init__(self, model: str, output: str = "average", mix: Sequence[float] | None = None,
               sentence_vectors: bool = False, dtype: str = "float32", tokenize: bool = False,
               batch_size: int | None = None, large_model: bool = False, warm: bool = False):
    self.fmt = worker.output_format(output, mix, sentence_vectors, dtype)  # a bad choice fails at construction
    self.model, self.tokenize, self.warm = model, tokenize, warm
    super().__init__(min_batch_size=1, max_batch_size=batch_size or DEFAULT_BATCH_SIZE, large_model=large_model)

  def load_model(self) -> Embedder:
    embedder = Embedder.from_pretrained(self.model, warm=self.warm)
    worker.check_mix(embedder, self.fmt)
    return embedder

  def run_inference(self, batch: Sequence[Element], model: Embedder,
                    inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
    if inference_args:
      raise ValueError(f"ElmoModelHandler takes no inference_args, got {sorted(inference_args)}")
    tokenizer = Tokenizer() if self.tokenize else None
    sentences = [(tokenizer(e) if tokenizer is not None else e.split()) if isinstance(e, str) else list(e)
                 for e in batch]
    outputs = worker.embed_lines(model, sentences, self.fmt, lambda i: f"element {i} of the batch")
    return [PredictionResult(example, inference) for example, inference in zip(batch, outputs)]

  def get_num_bytes(self, batch: Sequence[Element]) -> int:
    return sum(len(e.encode()) if isinstance(e, str) else sum(len(t.encode()) + 1 for t in e) for e in batch)

  def get_metrics_namespace(self) -> str:
    return "ElmoJax"
