"""A pretrained model as a TensorFlow SavedModel, from Python: :func:`export_saved_model` and
:func:`load_saved_model`.

The SavedModel is the one ``python -m uniclr_tf.export`` writes for a run folder: its
``serving_default`` signature takes uint8 images ``[batch, height, width, C]`` (any height and
width: resampled to the training size as :class:`uniclr_tf.EvalPreprocess` does) and returns
float32 ``features`` (the backbone's) and ``embedding`` (the projector's), in inference mode. It
loads with ``tf.saved_model.load`` alone, in a process that has neither Keras nor uniclr_tf
imported, and serves from TF Serving.
"""

import json
import os

from uniclr_tf.serving.export import (BACKBONE_FILE, EXPORT_JSON, INPUT_NAME, OUTPUT_NAMES, SIGNATURE,
                                      check_export_target, check_images, find_saved_model,
                                      replace_dir, require_tensorflow_backend, staging_folder,
                                      write_saved_model)

__all__ = ["export_saved_model", "load_saved_model"]


def _check_target(directory, overwrite):
    """:func:`~uniclr_tf.serving.export.check_export_target`, its refusal naming this function's arguments."""
    try:
        check_export_target(directory, None, overwrite)
    except ValueError as e:
        message = str(e).replace("--out=", "directory=").replace("--overwrite", "overwrite=True")
        raise ValueError(message.replace("--out", "directory")) from None


def _preprocess_for(model, preprocess):
    """``preprocess``, or the :class:`~uniclr_tf.augment.EvalPreprocess` matching the model's view
    augmenter (its global view size, mean and std)."""
    from uniclr_tf.augment import EvalPreprocess
    if preprocess is not None:
        if not isinstance(preprocess, EvalPreprocess):
            raise TypeError(f"preprocess: expected a uniclr_tf.EvalPreprocess; received {type(preprocess).__name__}")
        return preprocess
    augmenter = getattr(model, "augmenter", None)
    if augmenter is None or not hasattr(augmenter, "global_size"):
        raise ValueError("preprocess: the model has no view augmenter to take the image size, mean and std from; "
                         "pass preprocess=uniclr_tf.EvalPreprocess(size, mean, std) (those of training)")
    return EvalPreprocess(augmenter.global_size, augmenter.mean, augmenter.std, input_scale=augmenter.input_scale)


def export_saved_model(model, directory, preprocess=None, overwrite=False):
    """Writes ``model``'s encoder and projector as a SavedModel for serving; returns the export's
    description (what ``directory/export.json`` holds).

    ``directory`` receives the SavedModel (``saved_model.pb``, ``variables/``), the encoder as
    ``backbone.keras`` (for fine-tuning) and ``export.json`` (input, outputs, image size, mean, std).
    It must be missing or empty unless ``overwrite``, which replaces it; the export is written aside
    and renamed into place, so an interrupted export never leaves a half-written folder. Needs the
    TensorFlow backend (a model trained under JAX: save its weights, load them under TensorFlow).

    Examples:
        >>> info = uniclr_tf.export_saved_model(model, "export/encoder")
        >>> serve = uniclr_tf.load_saved_model("export/encoder")
        >>> serve(images_uint8)["features"].shape
        (8, 512)

    Args:
      model: a :class:`uniclr_tf.UniCLR` (its ``encoder`` and ``projector`` are exported).
      directory: the export folder.
      preprocess: the :class:`uniclr_tf.EvalPreprocess` of the images the encoder expects; None
        takes the size, mean and std of ``model.augmenter``.
      overwrite: replace a non-empty ``directory`` holding an earlier export.
    """
    import keras

    from uniclr_tf.nets.model import UniCLR
    if not isinstance(model, UniCLR):
        raise TypeError(f"model: expected a uniclr_tf.UniCLR; received {type(model).__name__}")
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise TypeError(f"directory: expected a folder path; received {directory!r}")
    directory = os.fspath(directory)
    preprocess = _preprocess_for(model, preprocess)
    _check_target(directory, overwrite)
    require_tensorflow_backend()
    import tensorflow as tf

    encoder, projector = model.encoder, model.projector
    channels = int(encoder.input_shape[-1])
    size = list(preprocess.size)
    meta = {"signature": SIGNATURE,
            "input": {"name": INPUT_NAME, "dtype": "uint8", "shape": [None, None, None, channels]},
            "outputs": {"features": int(encoder.output_shape[-1]), "embedding": int(projector.output_shape[-1])},
            "image_size": size, "mean": None if preprocess.mean is None else list(map(float, preprocess.mean)),
            "std": None if preprocess.std is None else list(map(float, preprocess.std)),
            "method": model.method.name, "backbone": BACKBONE_FILE, "keras": keras.__version__,
            "tensorflow": tf.__version__}
    with staging_folder(directory) as (staging, dest):
        write_saved_model(staging, encoder, projector, preprocess)
        encoder.save(os.path.join(staging, BACKBONE_FILE))
        with open(os.path.join(staging, EXPORT_JSON), "w") as f:
            json.dump(meta, f, indent=1)
        _check_target(directory, overwrite)  # still free (nothing appeared meanwhile)
        replace_dir(staging, dest)
    return meta


def load_saved_model(directory):
    """The ``serving_default`` function of an exported SavedModel, as a Python function: uint8 images
    ``[batch, height, width, C]`` (a NumPy array or a tensor) -> ``{"features", "embedding"}`` as
    NumPy float32 arrays. ``directory``: an export folder (of :func:`export_saved_model` or
    ``python -m uniclr_tf.export``, a versioned one too) or a SavedModel folder. Any Keras backend
    (TensorFlow must be installed).

    Examples:
        >>> serve = uniclr_tf.load_saved_model("export/encoder")
        >>> features = serve(np.zeros((4, 28, 28, 1), "uint8"))["features"]

    The same with TensorFlow alone::

        signature = tf.saved_model.load("export/encoder").signatures["serving_default"]
        features = signature(images=tf.constant(images_uint8))["features"]
    """
    import tensorflow as tf

    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory: expected a folder path; received {directory!r}")
    path = find_saved_model(os.fspath(directory))
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures[SIGNATURE]
    channels = int(signature.structured_input_signature[1][INPUT_NAME].shape[-1])

    def serve(images):
        images = check_images(images, channels)
        outputs = signature(**{INPUT_NAME: tf.constant(images)})
        return {name: outputs[name].numpy() for name in OUTPUT_NAMES}

    serve.saved_model = loaded  # kept alive with the function (its variables)
    serve.path = path
    return serve
