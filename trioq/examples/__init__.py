"""Small example apps; ``trioq serve --app trioq.examples.hello:tasks`` runs one."""
