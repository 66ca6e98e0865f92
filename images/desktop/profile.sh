# Login shells (`exec`'s `bash -lc`): the user's own programs first. `pip install` (a user install,
# as the agent) and `npm install -g` (NPM_CONFIG_PREFIX, corral.sandbox.agent.agentenv) put them in
# ~/.local/bin; it is on PATH before it exists, so a program installed by a command runs in the
# same command. Builtins only: a login shell starts in about 0.1 ms more than `bash -c`.
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) PATH="$HOME/.local/bin:$PATH" ;;
esac
export PATH
