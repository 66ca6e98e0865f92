"""Templates: the base image plus what a user adds (Debian, Python and npm packages, files, an
environment, a setup command), from ``corral.template.yaml`` or a Dockerfile on the base; built
where no registry is reachable, cached, versioned, and checked so that a template can add software
but never weaken the sandbox (docs/environments.md, docs/design/0320-template-check-at-start.md)."""
