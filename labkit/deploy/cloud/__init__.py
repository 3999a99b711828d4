"""Job specifications for the managed services of the source material (``labkit cloud``): Vertex AI,
Azure ML and SageMaker, each running the course image (``labkit image build``) for the course's three
distributed solutions, and each checked offline by the service's own SDK (the optional ``cloud`` extra).

``PROVIDERS`` is the table of services: each entry is a module with ``NAME``, ``EXT``, ``build(plan)``,
``render(plan, header)`` and ``validate(obj)`` (:mod:`.vertex`, :mod:`.azureml`, :mod:`.sagemaker`).
"""

from labkit.deploy.cloud import azureml, sagemaker, vertex

PROVIDERS = {"vertex": vertex, "azureml": azureml, "sagemaker": sagemaker}
SDKS = {"vertex": "google.cloud.aiplatform_v1", "azureml": "azure.ai.ml", "sagemaker": "sagemaker.core"}
