"""Running the labs elsewhere: Kubernetes manifests (Kubeflow) validated offline against the schemas shipped here."""
