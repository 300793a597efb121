"""KVzip (Kim et al. 2025) in one place: the scorer and its options (scorer.py), the
reconstruction attention on ragged groups and its scores (attention.py), the reconstruction
pass inside SGLang's prefill forward (serving_pass.py), and the teacher scores calibration
trains the FastKVzip gates on (calibration/kvzip_teacher.py: Hugging Face models, offline)."""

from tangram_sglang.scorers.kvzip.scorer import KVzipScorer

__all__ = ["KVzipScorer"]
