"""The GLUE metrics as an ``evaluate`` metric module, shipped with the package so that ``evaluate.load`` finds it
offline (the Hub's ``glue`` metric is a script downloaded at load time). Load it with
:func:`modeling_tnn.recipes.glue.metrics.load_glue_metric`; its configuration name is the task
(``evaluate.load(<this file>, "mrpc")``).

The definitions are GLUE's: Matthews correlation for CoLA, accuracy and F1 (of the positive class) for MRPC and QQP,
Pearson and Spearman correlations for STS-B, accuracy for the other tasks; the result keys are those of the Hub's
``glue`` metric. ``evaluate`` copies this file into its module cache and imports it from there, so it imports the
package absolutely.
"""

import datasets
import evaluate

from modeling_tnn.recipes.glue.metrics import metric_values
from modeling_tnn.recipes.glue.tasks import TASK_NAMES, get_task

_DESCRIPTION = "GLUE's official metric of each task: CoLA Matthews correlation; MRPC and QQP accuracy and F1; STS-B " \
               "Pearson and Spearman correlations; accuracy for SST-2, MNLI, QNLI, RTE and WNLI."
_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (STS-B: predicted similarity scores).
    references: gold class ids (STS-B: gold scores).
Returns:
    accuracy, f1, matthews_correlation, pearson, spearmanr: as the task defines its metric (floats).
"""


class Glue(evaluate.Metric):
    """GLUE's metric of the task named by the configuration (one of the GLUE task names)."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in TASK_NAMES:
            raise KeyError(f"Unknown GLUE task {self.config_name!r}: choose one of {', '.join(TASK_NAMES)}.")
        # float64 scores (the Hub module reads float32): the correlations keep the precision the references have.
        value_type = "float64" if get_task(self.config_name).is_regression else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(value_type),
                                        "references": datasets.Value(value_type)}),
            # Python values, not "numpy": datasets' numpy formatter would hand float64 scores over as float32.
            format=None,
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        return metric_values(get_task(self.config_name).metrics, predictions, references)
