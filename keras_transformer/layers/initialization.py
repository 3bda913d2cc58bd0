"""One initializer per weight.

An unseeded Keras 3 initializer draws its seed once, when it is constructed,
and returns the same values at every call. A layer that created W^Q, W^K,
W^V and W^O (§3.2.2), or W_1 and W_2 (§3.3), from one instance therefore
started with equal matrices. The layers keep the initializer the user passed
(their config serializes it) and give every weight its own copy from
`initializer_for_weight`.
"""

import keras


def initializer_for_weight(initializer, index=0):
    """The initializer to create a layer's `index`-th weight made from `initializer` with.

    - Unseeded: a clone, which draws a new seed from Python's `random`; so
      `keras.utils.set_random_seed` still fixes every weight.
    - Seeded with an int: a clone seeded with `seed + index`, reproducible,
      yet the weights of one layer differ (`index` 0 keeps the user's seed).
    - Seeded with a `keras.random.SeedGenerator`: the initializer itself;
      every call already advances the generator (a clone would restart it).
    - Not a Keras initializer (a plain function): itself.

    Args:
        initializer: a `keras.initializers.Initializer` (after `keras.initializers.get`).
        index: which of the layer's weights made from this initializer it is.

    Example:
    >>> init = keras.initializers.GlorotUniform()
    >>> bool(keras.ops.all(init((4, 4)) == init((4, 4))))  # one instance: equal matrices
    True
    >>> w_q = initializer_for_weight(init, 0)((4, 4))
    >>> w_k = initializer_for_weight(init, 1)((4, 4))
    >>> bool(keras.ops.all(w_q == w_k))
    False
    >>> seeded = keras.initializers.GlorotUniform(seed=7)
    >>> [initializer_for_weight(seeded, i).seed for i in range(3)]
    [7, 8, 9]
    """
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    if isinstance(getattr(initializer, "seed", None), keras.random.SeedGenerator):
        return initializer
    config = initializer.get_config()
    seed = config.get("seed")
    if index and isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = seed + index
    # What `Initializer.clone()` does, here with the adjusted config.
    return initializer.__class__.from_config(config)
