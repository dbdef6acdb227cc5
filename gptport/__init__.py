"""gptport: from a raw text corpus to a portable, fast ONNX GPT.

Importing this package loads neither torch nor onnxruntime; the stages that need them
import them inside their own modules.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
