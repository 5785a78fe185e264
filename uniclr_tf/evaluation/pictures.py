"""Pictures of what a run learned: its views, its nearest neighbours, its embedding.

:func:`write_run_pictures` is the one call a training run makes at its end; it writes into the run
folder

* ``views.png``: originals (first column) and their augmented views as the model sees them
  (:func:`views_grid`);
* ``neighbours.png``: test images and their nearest training images by cosine similarity of the
  backbone features, wrong-class neighbours framed red (:func:`neighbours_grid`);
* ``embedding.png``: a 2-D map (t-SNE, else PCA) of the test features coloured by class
  (:func:`embedding_map`);

and, when TensorFlow is installed, the same three images plus the test features (with class
names and thumbnails) for TensorBoard's projector into ``tb/pictures``. A failure never stops the
run: it is reported on one warning line and that picture is simply absent.

Only NumPy and the standard library are imported at module level; matplotlib (an Agg canvas, no
pyplot: no global state), Keras, TensorFlow, TensorBoard, scikit-learn and Pillow are imported where
they are used, so the PNGs are written under ``KERAS_BACKEND=jax`` without TensorFlow, and a
missing package costs a picture, not the run.
"""

import collections
import contextlib
import math
import os
import sys
import warnings

import numpy as np

from uniclr_tf.data.sources.fashion_mnist import FASHION_MNIST_CLASSES  # noqa: F401 (in __all__)
from uniclr_tf.evaluation.features import _to_numpy
from uniclr_tf.training.runs import atomic_save

__all__ = [
    "FASHION_MNIST_CLASSES",
    "NeighboursResult",
    "embedding_map",
    "frame_colours",
    "nearest_neighbours",
    "neighbours_grid",
    "project_2d",
    "views_grid",
    "write_run_pictures",
]

#: Frame colours of :func:`neighbours_grid`: neighbour of the query's class / of another class /
#: label unknown; and the darker shades used for their text.
SAME_COLOUR, OTHER_COLOUR, UNKNOWN_COLOUR = "#2ca02c", "#d62728", "#9a9a9a"
_TEXT_COLOUR = {SAME_COLOUR: "#1b7a1b", OTHER_COLOUR: "#b01515", UNKNOWN_COLOUR: "#555555"}

_DPI = 110

NeighboursResult = collections.namedtuple("NeighboursResult", ["path", "same_class_fraction"])
NeighboursResult.__doc__ = """What :func:`neighbours_grid` returns: the PNG's path and the
fraction of shown neighbours of the query's class (None without labels)."""


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------




def _figure(figsize):
    """A matplotlib Figure on an Agg canvas (no pyplot: no global state, no GUI backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path):
    """Writes ``fig`` as a PNG at ``path`` (atomically: temp file + rename). Returns the path."""
    path = os.fspath(path)
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=_DPI, format="png", facecolor="white"))
    return path


def _grid_figure(col_widths, row_height, nrows, left=0.15, right=0.15, top=0.9, bottom=0.15,
                 wspace=0.08, hspace=0.08, min_width=0.0):
    """A figure sized to a grid of image cells (all sizes in inches) and its GridSpec, so that the
    images fill their cells instead of floating in white space. A grid narrower than
    ``min_width`` (room for the titles) is centred."""
    col_widths = [float(w) for w in col_widths]
    width = left + right + sum(col_widths) + wspace * (len(col_widths) - 1)
    if width < min_width:
        left, right = left + (min_width - width) / 2, right + (min_width - width) / 2
        width = min_width
    height = top + bottom + nrows * row_height + hspace * (nrows - 1)
    fig = _figure((width, height))
    gs = fig.add_gridspec(nrows, len(col_widths), width_ratios=col_widths,
                          left=left / width, right=1 - right / width,
                          bottom=bottom / height, top=1 - top / height,
                          wspace=wspace / np.mean(col_widths), hspace=hspace / row_height)
    return fig, gs


def _show(ax, image, frame=None, frame_width=3.0):
    """An image (``[H, W, C]`` floats in [0, 1], or uint8 / float 0-255) without ticks; a grey
    image uses a grey colour map. ``frame``: colour of a thick border, else a thin grey one."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8 and image.size and float(np.max(image)) > 1.0:
        image = np.clip(image, 0, 255).astype(np.uint8)  # float 0-255 pixels
    vmax = 255 if image.dtype == np.uint8 else 1.0
    # "antialiased": crisp pixels when a small image is enlarged (> 3x), smoothed when shrunk
    if image.ndim == 2:
        ax.imshow(image, cmap="gray", vmin=0, vmax=vmax, interpolation="antialiased")
    else:
        ax.imshow(image, interpolation="antialiased")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor(frame or "#c8c8c8")
        spine.set_linewidth(frame_width if frame else 0.6)


def _class_name(label, class_names):
    if label is None or int(label) < 0:
        return "?"
    label = int(label)
    if class_names is not None and label < len(class_names):
        return str(class_names[label])
    return f"class {label}"


def _warn(what, error):
    message = str(error).strip().splitlines()
    message = f": {message[0]}" if message else ""
    print(f"WARNING: pictures: {what} not written ({type(error).__name__}{message})",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------------------------


def _unnormalise(view, augmenter):
    """A normalised view ``[B, h, w, C]`` → [0, 1] for display with the augmenter's mean/std
    (None means the defaults of ``Normalize``: ImageNet for RGB, 0.5 / 0.5 for one channel)."""
    from uniclr_tf.augment.functional import _default_stats

    channels = view.shape[-1]
    mean, std = _default_stats(channels, getattr(augmenter, "mean", None), getattr(augmenter, "std", None))
    mean = np.resize(np.asarray(mean, np.float32), channels)
    std = np.resize(np.asarray(std, np.float32), channels)
    return np.clip(view.astype(np.float32) * std + mean, 0.0, 1.0)


def _augment(augmenter, images):
    """``augmenter(images, training=True)``; on JAX as one compiled program (a Keras layer's random
    state mapped in through a ``StatelessScope`` and written back, as in the train step), not one
    XLA compile per ``keras.ops`` call of every augmentation layer (about 60)."""
    import keras
    if keras.backend.backend() != "jax" or not isinstance(augmenter, keras.layers.Layer):
        return augmenter(images, training=True)
    from uniclr_tf.objectives.tensors import compiled
    variables = list(augmenter.variables)

    def augment_views(values, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            views = augmenter(x, training=True)
        new = [scope.get_current_value(v) for v in variables]
        return views, [old if value is None else value for value, old in zip(new, values)]

    views, values = compiled(augment_views)([v.value for v in variables], images)
    for variable, value in zip(variables, values):
        variable.assign(value)
    return views


def views_grid(augmenter, images, path, rows=8):
    """Writes a PNG of ``rows`` images (first column) and their augmented views as the model sees
    them: ``augmenter(images, training=True)``, global views then local views, un-normalised with
    the augmenter's ``mean`` / ``std``. Local views are drawn at their size relative to the
    global ones. Returns ``path``.

    Args:
      augmenter: a :class:`uniclr_tf.augment.ViewAugmenter` (any callable returning a tuple of
        normalised float views ``[B, h, w, C]`` works; ``num_global`` tells globals from locals).
      images: uint8 ``[N, H, W, C]`` (C = 1 or 3); the first ``rows`` are used.
      path: the PNG to write.
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    rows = int(min(rows, len(images)))
    if rows < 1:
        raise ValueError("views_grid needs at least one image")
    images = images[:rows]
    views = _augment(augmenter, images)
    if images.dtype != np.uint8:  # float 0-255 (the augmenter's other input) → display as uint8
        images = np.clip(np.round(images), 0, 255).astype(np.uint8)
    if not isinstance(views, (tuple, list)):
        views = (views,)
    views = [_unnormalise(_to_numpy(v), augmenter) for v in views]
    num_global = int(getattr(augmenter, "num_global", len(views)))
    names = [f"global {i + 1}" if i < num_global else f"local {i - num_global + 1}"
             for i in range(len(views))]

    ref_height = max([images.shape[1]] + [v.shape[1] for v in views])
    cell = 1.25  # inches for the tallest image
    scale = cell / ref_height
    columns = [images] + views
    titles = ["original"] + names
    col_widths = [max(c.shape[2] * scale, 0.72) for c in columns]  # room for the titles
    col_widths.insert(1, 0.15)  # a spacer between the originals and the views
    fig, gs = _grid_figure(col_widths, cell, rows, top=1.05, bottom=0.12, left=0.12, right=0.12,
                           wspace=0.06, hspace=0.06, min_width=5.2)
    for c, (column, title) in enumerate(zip(columns, titles)):
        g = c if c == 0 else c + 1
        h, w = column.shape[1:3]
        for r in range(rows):
            # a cell spans the tallest image: a smaller view is drawn at its size, centred
            box = gs[r, g].get_position(fig)
            frac_h, frac_w = h / ref_height, min(1.0, w * scale / col_widths[g])
            ax = fig.add_axes([box.x0 + box.width * (1 - frac_w) / 2,
                               box.y0 + box.height * (1 - frac_h) / 2,
                               box.width * frac_w, box.height * frac_h])
            _show(ax, column[r])
            if r == 0:
                fig.text((box.x0 + box.x1) / 2, box.y1 + 0.06 / fig.get_figheight(),
                         f"{title}\n{h}×{w} px", ha="center", va="bottom", fontsize=9,
                         fontweight="bold" if c == 0 else "normal")
    num_local = len(views) - num_global
    parts = [f"{num_global} global view{'s' if num_global != 1 else ''}"]
    if num_local:
        parts.append(f"{num_local} local view{'s' if num_local != 1 else ''} (drawn at their size)")
    top = fig.get_figheight()
    fig.text(0.5, 1 - 0.1 / top, "Training views as the model sees them", ha="center", va="top",
             fontsize=12)
    fig.text(0.5, 1 - 0.38 / top, "each image, then its " + " + ".join(parts), ha="center",
             va="top", fontsize=8.5, color="#444444")
    return _save(fig, path)


# --------------------------------------------------------------------------------------------
# Nearest neighbours
# --------------------------------------------------------------------------------------------


def _l2_normalise(x):
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nearest_neighbours(train_features, query_features, k):
    """Indices ``[Q, k]`` of the ``k`` most cosine-similar rows of ``train_features`` for each
    query (most similar first) and their similarities ``[Q, k]``."""
    train = _l2_normalise(train_features)
    queries = _l2_normalise(query_features)
    k = int(min(k, len(train)))
    sims = queries @ train.T
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < len(train) else \
        np.tile(np.arange(len(train)), (len(queries), 1))
    top_sims = np.take_along_axis(sims, top, axis=1)
    order = np.argsort(-top_sims, axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1), np.take_along_axis(top_sims, order, axis=1)


def _column_header(ax, text, **kwargs):
    """A header above the per-image title of a first-row cell."""
    ax.annotate(text, xy=(0.5, 1.0), xycoords="axes fraction", xytext=(0, 17),
                textcoords="offset points", ha="center", va="bottom", fontsize=9, **kwargs)


def frame_colours(query_labels, neighbour_labels):
    """Frame colour of each neighbour: ``SAME_COLOUR`` when its label is its query's,
    ``OTHER_COLOUR`` when not, ``UNKNOWN_COLOUR`` when either label is unknown (< 0).

    Args:
      query_labels: ``[Q]``; neighbour_labels: ``[Q, k]``.

    Returns:
      ``(colours [Q, k] array of str, same_class_fraction)``: the fraction of neighbours with
      known labels that share their query's class (None when no label is known).
    """
    query = np.asarray(query_labels).reshape(-1, 1)
    neighbours = np.asarray(neighbour_labels)
    known = (query >= 0) & (neighbours >= 0)
    same = known & (neighbours == query)
    colours = np.where(known, np.where(same, SAME_COLOUR, OTHER_COLOUR), UNKNOWN_COLOUR)
    fraction = float(same.sum() / known.sum()) if known.any() else None
    return colours, fraction


def neighbours_grid(train_features, train_images, train_labels, test_features, test_images,
                    test_labels, path, k=8, rows=8, class_names=None, seed=0):
    """Writes a PNG of ``rows`` test images (a fixed random choice per ``seed``), each followed by
    its ``k`` nearest training images by cosine similarity of the ℓ2-normalised features; a
    neighbour of the query's class gets a green frame, of another class a red one; class names
    and similarities are printed above and below each image. Labels may be None or -1
    (unknown: grey frames).

    Returns:
      :class:`NeighboursResult` ``(path, same_class_fraction)``: the fraction of the shown
      neighbours that share their query's class (None without labels).
    """
    test_features = np.asarray(test_features)
    rows = int(min(rows, len(test_features)))
    if rows < 1 or len(train_features) < 1 or k < 1:
        raise ValueError(f"neighbours_grid needs at least one test and one training feature and "
                         f"k >= 1; received {len(test_features)} test, {len(train_features)} "
                         f"training features, k={k}")
    rng = np.random.default_rng(seed)
    queries = np.sort(rng.choice(len(test_features), size=rows, replace=False))
    index, sims = nearest_neighbours(train_features, test_features[queries], k)
    k = index.shape[1]
    train_labels = (np.full(len(train_features), -1) if train_labels is None
                    else np.asarray(train_labels).reshape(-1))
    test_labels = (np.full(len(test_features), -1) if test_labels is None
                   else np.asarray(test_labels).reshape(-1))
    query_labels = test_labels[queries]
    neighbour_labels = train_labels[index]
    colours, fraction = frame_colours(query_labels, neighbour_labels)

    train_images, test_images = np.asarray(train_images), np.asarray(test_images)
    if train_images.ndim == 3:
        train_images = train_images[..., None]
    if test_images.ndim == 3:
        test_images = test_images[..., None]
    height, width = test_images.shape[1:3]
    cell = 1.05
    cell_w = cell * min(max(width / height, 0.5), 2.0)
    col_widths = [cell_w, 0.2] + [cell_w] * k
    fig, gs = _grid_figure(col_widths, cell, rows, top=1.2, bottom=0.2, left=0.15, right=0.15,
                           wspace=0.1, hspace=0.42, min_width=7.5)
    for r in range(rows):
        ax = fig.add_subplot(gs[r, 0])
        _show(ax, test_images[queries[r]], frame="#222222", frame_width=2.0)
        if query_labels[r] >= 0:
            ax.set_title(_class_name(query_labels[r], class_names), fontsize=8,
                         fontweight="bold", pad=3)
        if r == 0:
            _column_header(ax, "query", fontweight="bold")
        for j in range(k):
            ax = fig.add_subplot(gs[r, j + 2])
            colour = str(colours[r, j])
            _show(ax, train_images[index[r, j]],
                  frame=None if colour == UNKNOWN_COLOUR else colour)
            if neighbour_labels[r, j] >= 0:
                ax.set_title(_class_name(neighbour_labels[r, j], class_names), fontsize=7.5,
                             color=_TEXT_COLOUR.get(colour, "black"), pad=3)
            ax.set_xlabel(f"cos {sims[r, j]:.3f}", fontsize=6.5, color="#555555", labelpad=1.5)
            if r == 0:
                _column_header(ax, f"#{j + 1}")
    top = fig.get_figheight()
    title = f"Nearest training images of {rows} test images (cosine similarity of the features)"
    fig.text(0.5, 1 - 0.1 / top, title, ha="center", va="top", fontsize=12)
    if fraction is not None:
        note = (f"{fraction:.0%} of these neighbours share the query's class   ·   green frame: "
                f"same class   ·   red frame: another class")
    else:
        note = "no labels: neighbours are not checked against the query's class"
    fig.text(0.5, 1 - 0.38 / top, note, ha="center", va="top", fontsize=9, color="#444444")
    return NeighboursResult(_save(fig, path), fraction)


# --------------------------------------------------------------------------------------------
# Embedding map
# --------------------------------------------------------------------------------------------


def _pca(x, dims):
    """Rows of ``x`` projected on their first ``dims`` principal components, and the fraction
    of the variance each explains."""
    x = np.asarray(x, np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    dims = int(min(dims, vt.shape[0]))
    variance = s ** 2
    explained = variance[:dims] / max(variance.sum(), 1e-30)
    return x @ vt[:dims].T, explained


def _one_openmp_thread():
    """A context with scikit-learn's OpenMP limited to one thread: its Barnes-Hut t-SNE spins its
    OpenMP threads between the 500 gradient steps, and on a busy 2-core machine (or next to
    XLA's thread pool) two threads made 2,000 points take 20 s instead of 4 s, 40 points 3-7 s
    instead of 0.05 s."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="openmp")


def _tsne(x, seed):
    from sklearn.manifold import TSNE

    n = len(x)
    kwargs = dict(n_components=2, init="pca", random_state=int(seed),
                  perplexity=float(min(30.0, max(2.0, (n - 1) / 3.0))), angle=0.7,
                  learning_rate="auto")
    with warnings.catch_warnings(), _one_openmp_thread():
        warnings.simplefilter("ignore")
        try:  # scikit-learn >= 1.5
            tsne = TSNE(max_iter=500, **kwargs)
        except TypeError:
            tsne = TSNE(n_iter=500, **kwargs)
        return tsne.fit_transform(np.asarray(x, np.float32))


def project_2d(features, seed=0):
    """2-D coordinates of ``features [N, D]`` (ℓ2-normalised first, as the kNN sees them): t-SNE
    (scikit-learn, PCA init, fixed seed) of their first 50 principal components when scikit-learn
    is importable, else their first two principal components.

    Returns:
      ``(coords [N, 2], method, description)``: method ``"t-SNE"`` or ``"PCA"``, description a
      short line for titles (e.g. ``"512-D → PCA 50 → t-SNE"``).
    """
    x = _l2_normalise(features)
    n, dims = x.shape
    reduced, explained = _pca(x, 50)
    try:
        import sklearn.manifold  # noqa: F401
    except ImportError:
        have_tsne = False
    else:
        have_tsne = n >= 10
    if have_tsne:
        coords = _tsne(reduced, seed)
        reduced_dims = reduced.shape[1]
        note = (f"{dims}-D → PCA {reduced_dims} → t-SNE" if reduced_dims < dims
                else f"{dims}-D → t-SNE")
        return np.asarray(coords, np.float64), "t-SNE", note
    coords = reduced[:, :2]
    if coords.shape[1] < 2:
        coords = np.concatenate([coords, np.zeros((n, 2 - coords.shape[1]))], axis=1)
    shown = float(np.sum(explained[:2]))
    return coords, "PCA", f"{dims}-D → first 2 principal components ({shown:.0%} of the variance)"


def _class_colours(num):
    from matplotlib import colormaps

    if num <= 10:
        return [colormaps["tab10"](i) for i in range(num)]
    if num <= 20:
        return [colormaps["tab20"](i) for i in range(num)]
    return [colormaps["turbo"](i / max(num - 1, 1)) for i in range(num)]


def embedding_map(features, labels, path, class_names=None, max_points=2000, seed=0):
    """Writes a PNG of a 2-D map of ``features [N, D]`` coloured by class (legend with the class
    names): t-SNE when scikit-learn is importable, else PCA (the title says which;
    :func:`project_2d`). At most ``max_points`` points (a fixed random subset per ``seed``).
    ``labels`` may be None or -1 (one colour). Returns ``path``."""
    features = np.asarray(features)
    n = len(features)
    if n < 2:
        raise ValueError(f"embedding_map needs at least 2 points; received {n}")
    labels = np.full(n, -1) if labels is None else np.asarray(labels).reshape(-1)
    if n > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(n, size=int(max_points), replace=False))
        features, labels, n = features[keep], labels[keep], int(max_points)
    coords, method, note = project_2d(features, seed)

    present = sorted(int(c) for c in np.unique(labels) if c >= 0)
    legend = 0 < len(present) <= 20
    if legend:
        fig = _figure((9.2, 7.0))
        ax = fig.add_axes([0.05, 0.06, 0.68, 0.82])
    else:
        fig = _figure((7.4, 7.0))
        ax = fig.add_axes([0.06, 0.06, 0.88, 0.82])
    centre = (ax.get_position().x0 + ax.get_position().x1) / 2
    size = float(np.clip(16000.0 / n, 6.0, 40.0))
    if present:
        colours = _class_colours(max(present) + 1)
        for c in present:
            sel = labels == c
            ax.scatter(coords[sel, 0], coords[sel, 1], s=size, color=colours[c], alpha=0.75,
                       linewidths=0, label=f"{_class_name(c, class_names)} ({int(sel.sum())})")
    unknown = labels < 0
    if unknown.any():
        ax.scatter(coords[unknown, 0], coords[unknown, 1], s=size, color="#7f7f7f", alpha=0.6,
                   linewidths=0, label="unlabelled" if present else None)
    if legend:
        ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=9,
                  markerscale=math.sqrt(80.0 / size), frameon=False, title="class (points)",
                  title_fontsize=9, handletextpad=0.3)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor("#bbbbbb")
    if method == "PCA":
        ax.set_xlabel("PC 1", fontsize=9)
        ax.set_ylabel("PC 2", fontsize=9)
    if len(present) > 20:
        colouring = f", coloured by class ({len(present)} classes)"
    elif not present:
        colouring = " (no labels)"
    else:
        colouring = ""
    fig.suptitle(f"Test features, {method} map of {n} points{colouring}", fontsize=12, x=centre,
                 y=0.975)
    fig.text(centre, 0.915, note + ("" if method == "t-SNE" else
                                    "   (scikit-learn not installed: no t-SNE)"),
             ha="center", fontsize=9, color="#444444")
    return _save(fig, path)


# --------------------------------------------------------------------------------------------
# The one call of a training run
# --------------------------------------------------------------------------------------------


def _subset(pair, limit, seed):
    """At most ``limit`` items of ``(images, labels)``: a fixed random subset, in order."""
    images, labels = pair
    images = np.asarray(images)
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    n = len(images)
    if limit is None or n <= limit:
        return images, labels
    keep = np.sort(np.random.default_rng(seed).choice(n, size=int(limit), replace=False))
    return images[keep], (None if labels is None else labels[keep])


def _sprite(images, max_side=8192):
    """One PNG-able uint8 image tiling ``images`` (TensorBoard projector thumbnails), and the
    thumbnail size ``(h, w)``."""
    from PIL import Image

    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    n, height, width = images.shape[:3]
    per_row = int(math.ceil(math.sqrt(n)))
    # thumbnails of at most 64 px a side, the whole sprite within the projector's 8192 px
    scale = min(1.0, 64.0 / max(height, width), (max_side // per_row) / max(height, width))
    th, tw = max(1, int(height * scale)), max(1, int(width * scale))
    grey = images.shape[-1] == 1
    sprite = np.zeros((per_row * th, per_row * tw) + (() if grey else (3,)), np.uint8)
    for i, image in enumerate(images):
        image = np.clip(image, 0, 255).astype(np.uint8)
        image = image[..., 0] if grey else image[..., :3]
        if (height, width) != (th, tw):
            image = np.asarray(Image.fromarray(image).resize((tw, th), Image.BILINEAR))
        r, c = divmod(i, per_row)
        sprite[r * th:(r + 1) * th, c * tw:(c + 1) * tw] = image
    return sprite, (th, tw)


def _write_projector(logdir, features, labels, images, class_names):
    """The test features for TensorBoard's projector: ``features.tsv``, ``metadata.tsv`` (class
    names), ``sprite.png`` (thumbnails) and ``projector_config.pbtxt``. Returns True when the
    config was written (the projector needs it)."""
    from uniclr_tf.training.runs import atomic_write_text

    os.makedirs(logdir, exist_ok=True)
    lines = ["\t".join(f"{v:.6g}" for v in row) for row in np.asarray(features, np.float32)]
    atomic_write_text(os.path.join(logdir, "features.tsv"), "\n".join(lines) + "\n")
    if labels is not None:
        meta = ["class\tlabel"] + [f"{_class_name(y, class_names)}\t{int(y)}" for y in labels]
        atomic_write_text(os.path.join(logdir, "metadata.tsv"), "\n".join(meta) + "\n")
    sprite_size = None
    try:
        from PIL import Image

        sprite, sprite_size = _sprite(images)
        atomic_save(os.path.join(logdir, "sprite.png"),
                    lambda tmp: Image.fromarray(sprite).save(tmp, format="PNG"))
    except Exception:  # noqa: BLE001 - thumbnails are a nicety
        sprite_size = None
    try:
        from tensorboard.plugins import projector
    except Exception:
        return False
    config = projector.ProjectorConfig()
    embedding = config.embeddings.add()
    embedding.tensor_name = "test_features"
    embedding.tensor_path = "features.tsv"
    if labels is not None:
        embedding.metadata_path = "metadata.tsv"
    if sprite_size is not None:
        embedding.sprite.image_path = "sprite.png"
        embedding.sprite.single_image_dim.extend([sprite_size[1], sprite_size[0]])
    projector.visualize_embeddings(logdir, config)
    return True


def _write_tensorboard(logdir, pngs, features, labels, images, class_names):
    """The PNGs as TensorBoard images and the projector files; None when TensorFlow is missing."""
    try:
        import tensorflow as tf
    except ImportError:
        return None
    written = {}
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        for name, png in pngs.items():
            with open(png, "rb") as f:
                image = tf.io.decode_png(f.read(), channels=3)
            tf.summary.image(f"pictures/{name}", image[None], step=0,
                             description=f"{name}.png of the run folder")
    writer.flush()
    writer.close()
    written["tensorboard"] = logdir
    if features is not None:
        try:
            if _write_projector(logdir, features, labels, images, class_names):
                written["projector"] = logdir
        except Exception as e:  # noqa: BLE001 - a picture never fails the run
            _warn("TensorBoard projector", e)
    return written


def write_run_pictures(run_dir, encoder, preprocess, augmenter, train, test, class_names=None,
                       tensorboard=True, max_train=10000, max_test=2000, batch_size=512):
    """Writes ``views.png``, ``neighbours.png`` and ``embedding.png`` into ``run_dir`` and, when
    ``tensorboard`` and TensorFlow is importable, the three images and the test features
    (projector: ``features.tsv``, ``metadata.tsv``, ``sprite.png``, ``projector_config.pbtxt``)
    into ``run_dir/tb/pictures``. Never raises: a failure prints one warning line and that
    picture is absent.

    Args:
      run_dir: the run folder.
      encoder, preprocess: as :func:`uniclr_tf.evaluation.extract_features` (backbone, uint8 →
        model input).
      augmenter: the run's :class:`~uniclr_tf.augment.ViewAugmenter` (None: no ``views.png``).
      train, test: ``(uint8 images [N, H, W, C], labels [N])`` NumPy pairs (labels may be None or
        -1); at most ``max_train`` / ``max_test`` of them (a fixed random subset) are used.
      class_names: names of the labels (e.g. :data:`FASHION_MNIST_CLASSES`), else ``class N``.

    Returns:
      ``{"views", "neighbours", "embedding"}`` → path of each PNG written, plus ``"tensorboard"``
      and ``"projector"`` → ``run_dir/tb/pictures`` when those were written.
    """
    out = {}
    try:
        run_dir = os.fspath(run_dir)
        os.makedirs(run_dir, exist_ok=True)
        train_x, train_y = _subset(train, max_train, seed=0)
        test_x, test_y = _subset(test, max_test, seed=1)
    except Exception as e:  # noqa: BLE001
        _warn("pictures", e)
        return out
    if augmenter is not None:
        try:
            out["views"] = views_grid(augmenter, train_x[:8], os.path.join(run_dir, "views.png"))
        except Exception as e:  # noqa: BLE001
            _warn("views.png", e)
    train_f = test_f = None
    try:
        from uniclr_tf.evaluation.features import features_on_host

        train_f = features_on_host(encoder, preprocess, train_x, batch_size)
        test_f = features_on_host(encoder, preprocess, test_x, batch_size)
    except Exception as e:  # noqa: BLE001
        _warn("neighbours.png and embedding.png (feature extraction failed)", e)
        train_f = test_f = None
    if train_f is not None:
        try:
            out["neighbours"] = neighbours_grid(
                train_f, train_x, train_y, test_f, test_x, test_y,
                os.path.join(run_dir, "neighbours.png"), class_names=class_names).path
        except Exception as e:  # noqa: BLE001
            _warn("neighbours.png", e)
        try:
            out["embedding"] = embedding_map(test_f, test_y, os.path.join(run_dir, "embedding.png"),
                                             class_names=class_names)
        except Exception as e:  # noqa: BLE001
            _warn("embedding.png", e)
    if tensorboard:
        try:
            written = _write_tensorboard(os.path.join(run_dir, "tb", "pictures"),
                                         {k: out[k] for k in ("views", "neighbours", "embedding")
                                          if k in out}, test_f, test_y, test_x, class_names)
            out.update(written or {})
        except Exception as e:  # noqa: BLE001
            _warn("TensorBoard pictures", e)
    return out
