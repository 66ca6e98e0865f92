"""Files and tools: file actions as the agent, the editor, apply_patch, search, transfers over HTTP."""
