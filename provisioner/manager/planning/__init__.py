"""What the manager decides, as pure functions of its caches: the planners of Bundles
(``bundleplan``), of v1alpha1 and v1alpha2 BundleDeployments (``plan``, ``inline``), their
revisions, dependencies, approvals and runs, the sources they pin and the objects they
generate (``generate``). Nothing here writes to the cluster: ``acting`` does."""
