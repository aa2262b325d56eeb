//! Specs from a repository: reads the YAML files at a revision into typed objects, with every
//! error located at `file:line:column`. An invalid file blocks only its own objects.
