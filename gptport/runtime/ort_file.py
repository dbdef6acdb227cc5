"""Reading an `.ort` file (ONNX Runtime's own format, `export --ort-format`) without creating a session:
its metadata, straight from the flatbuffer, and the check that this onnxruntime wrote it. An `.ort` file
saved by one onnxruntime release does not load in another (its kernels are resolved by hashes of that
release's registrations), and onnxruntime says so obscurely or not at all; this says it in one line."""

from __future__ import annotations

from pathlib import Path

from gptport.errors import ArtifactError

META_LEVEL = "gptport.ort_level"  # the graph optimization level the file was saved at
META_RUNTIME = "gptport.ort_onnxruntime"  # the onnxruntime version that saved it


def metadata(path: Path) -> dict[str, str]:
    """The graph's metadata_props, read from the ORT flatbuffer."""
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

    data = path.read_bytes()
    if data[4:8] != b"ORTM":
        raise ArtifactError(f"{path}: not an ONNX Runtime format (.ort) file")
    try:
        model = InferenceSession.GetRootAsInferenceSession(data, 0).Model()
        props = [model.MetadataProps(i) for i in range(model.MetadataPropsLength())] if model else []
        return {p.Key().decode(): p.Value().decode() for p in props}
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        raise ArtifactError(f"{path}: a damaged .ort file ({e})") from e


def check_runtime(path: Path, meta: dict[str, str]) -> None:
    """Refuse an .ort file written by another onnxruntime version than the one installed."""
    import onnxruntime as ort

    wrote = meta.get(META_RUNTIME)
    if wrote is None:
        raise ArtifactError(f"{path}: records no onnxruntime version ({META_RUNTIME}); write it again with "
                            "`gptport export --ort-format`")
    if wrote != ort.__version__:
        raise ArtifactError(f"{path}: written by onnxruntime {wrote}, but this is onnxruntime {ort.__version__} (an "
                            "ORT-format file loads only in the version that wrote it); run `gptport export "
                            "--ort-format` again here, or use the .onnx graph")
