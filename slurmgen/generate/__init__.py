"""The generator: from flags and a YAML file to a validated spec, a rank table and script text.

`specfile` reads YAML 1.2 and CLI overrides into a frozen `spec.JobSpec`; `hostlist`,
`hostfile` and `topology` turn hosts into the rank table; `render` turns a spec into script
text (pure, Jinja2 with shell quoting from `shell`); `output` writes a render all-or-nothing;
`preflight` notes what this machine can tell about the job's programs. Everything but
`output` and `preflight` is pure; `launch`, `jobs`, `coordinator` and `doctor` build on it.
"""
