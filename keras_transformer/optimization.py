"""The optimizer and learning-rate schedule of the paper (Vaswani et al., 2017, §5.3).

"We used the Adam optimizer with beta_1 = 0.9, beta_2 = 0.98 and
epsilon = 10^-9. We varied the learning rate over the course of training,
according to the formula:

    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)      (3)

This corresponds to increasing the learning rate linearly for the first
warmup_steps training steps, and decreasing it thereafter proportionally to
the inverse square root of the step number. We used warmup_steps = 4000."

`create_optimizer` returns that optimizer: a `FusedAdam` (Keras' Adam,
whose dense updates on TensorFlow run as the fused kernel of
`keras_transformer.kernels.adam`) on a `TransformerSchedule`.
"""

import keras
from keras import ops

from keras_transformer.kernels import adam as adam_kernel


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Equation (3): linear warmup, then decay with the inverse square root of the step (§5.3).

    Keras calls a schedule with `optimizer.iterations`, the number of updates
    already applied (0 for the first). The paper counts steps from 1, so the
    update with `iterations = k` uses `step_num = k + 1`: the first update
    gets a small positive rate, not zero. Use `rate(step_num)` for the
    formula itself.

    Args:
        d_model: model width.
        warmup_steps: steps of linear warmup (4000 in the paper).
        scale: constant multiplier on the formula (1.0 in the paper;
            tensor2tensor later used 2.0).

    Example:
    >>> schedule = TransformerSchedule(512)
    >>> float(schedule.rate(4000))  # the peak: 512^-0.5 * 4000^-0.5
    0.000698...
    >>> float(schedule(0))  # the first update (iterations 0) uses step_num 1
    1.74...e-07
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                f"TransformerSchedule: d_model and warmup_steps must be positive, got {d_model} and {warmup_steps}."
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def rate(self, step_num):
        """Equation (3) at the 1-based `step_num`."""
        step_num = ops.cast(step_num, "float32")
        return self.scale * self.d_model**-0.5 * ops.minimum(ops.rsqrt(step_num), step_num * self.warmup_steps**-1.5)

    def __call__(self, step):
        return self.rate(ops.cast(step, "float32") + 1.0)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Cooldown(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule times a factor that the training loop lowers from 1 to 0 at the end of a run.

    Not the paper's: equation (3) only decays with the inverse square root of
    the step (§5.3), and the paper averages checkpoints instead (§6.1). Short
    runs end with a high rate; bringing it down to zero over the run's last
    steps (the "cooldown" of warmup-stable-decay schedules, Hägele et al.,
    2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations") lands the weights where averaging only approximates.

    The factor is a variable rather than a function of the step because a run
    stopped by a time budget learns its last step only as the time runs out:
    `training.callbacks.LinearCooldown` sets it before every step from the
    run's progress. At 1.0 (its initial value) this is the wrapped schedule.

    Args:
        schedule: the schedule to scale (a `LearningRateSchedule`, or its
            serialized config).
        factor: the factor's initial value.

    Example:
    >>> schedule = Cooldown(TransformerSchedule(512))
    >>> _ = schedule.factor.assign(0.5)
    >>> round(float(schedule(3999)) / float(TransformerSchedule(512)(3999)), 6)
    0.5
    """

    def __init__(self, schedule, factor=1.0):
        if isinstance(schedule, dict):
            schedule = keras.saving.deserialize_keras_object(schedule)
        self.schedule = schedule
        self.factor = keras.Variable(factor, dtype="float32", trainable=False, name="cooldown_factor")

    def __call__(self, step):
        return self.schedule(step) * ops.convert_to_tensor(self.factor)

    def get_config(self):
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "factor": float(ops.convert_to_numpy(self.factor)),
        }


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose dense updates on TensorFlow run as one fused kernel per variable (§5.3).

    The same update as Keras' Adam, computed by `kernels.adam.fused_update`
    where it applies (a dense gradient, the TensorFlow backend, no
    `amsgrad`); sparse gradients, `amsgrad` and other backends use Keras'
    code. Arguments and config are Keras' Adam's.

    A model saved compiled but never trained (a run's final `model.keras`)
    holds the state of an unbuilt optimizer: its step counter, no moments.
    Keras builds the optimizer of a reloaded model before loading that
    state, and then skips it with a warning; here it is loaded into the
    variables it belongs to, the moments staying at their initial zeros. A
    checkpoint written without optimizer state (the training checkpoints)
    leaves the optimizer as it is, quietly too.

    Example:
    >>> optimizer = FusedAdam(learning_rate=0.1)
    >>> weight = keras.Variable([1.0, -1.0])
    >>> optimizer.apply([ops.array([0.5, -2.0])], [weight])
    >>> [round(float(w), 4) for w in weight.numpy()]  # Adam's first step: lr * sign(g)
    [0.9, -0.9]
    """

    def build(self, var_list):
        if not self.built:
            self._unbuilt_variable_count = len(self.variables)  # step counter (and a float rate's variable)
        super().build(var_list)

    def load_own_variables(self, store):
        """Loads the optimizer's state, also when it was saved unbuilt or not at all (see above)."""
        if not store.keys():  # a weights-only checkpoint (`run_dir.save_model_weights`): nothing to load
            return
        unbuilt = getattr(self, "_unbuilt_variable_count", None)
        if unbuilt is not None and len(store.keys()) == unbuilt < len(self.variables):
            for i, variable in enumerate(self.variables[:unbuilt]):
                variable.assign(store[str(i)])
            return
        super().load_own_variables(store)

    def update_step(self, gradient, variable, learning_rate):
        """Keras' Adam update of one variable; the fused kernel where it applies."""
        if adam_kernel.fused_update_applies(self, gradient):
            return adam_kernel.fused_update(self, gradient, variable, learning_rate)
        return super().update_step(gradient, variable, learning_rate)


def create_optimizer(d_model, warmup_steps=4000, scale=1.0, cooldown=False, **kwargs):
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the schedule of equation (3) (§5.3).

    Args:
        d_model: model width, for equation (3).
        warmup_steps: steps of linear warmup (4000 in the paper).
        scale: constant multiplier on equation (3) (1.0 in the paper).
        cooldown: wrap the schedule in a `Cooldown` (not the paper's; a
            training option).
        **kwargs: more arguments of `keras.optimizers.Adam` (e.g.
            `clipnorm`), or other betas and epsilon.

    Returns:
        A `FusedAdam`.

    Example:
    >>> optimizer = create_optimizer(512)
    >>> (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon)
    (0.9, 0.98, 1e-09)
    >>> float(optimizer.learning_rate)  # equation (3) at step_num 1
    1.74...e-07
    """
    options = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    options.update(kwargs)
    schedule = TransformerSchedule(d_model, warmup_steps, scale)
    return FusedAdam(learning_rate=Cooldown(schedule) if cooldown else schedule, **options)
