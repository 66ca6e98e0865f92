"""The browser and CDP: Playwright's connection, the CDP relay and its turn rules, DevTools, the front tab."""
