package config

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxScheduleTimeoutSeconds is the framework's cap on one Permit wait (15 min);
// a longer timeout would be cut silently, so it is rejected instead.
const MaxScheduleTimeoutSeconds = 15 * 60

// TopologyPresetNames are the presets v1.TopologyPresets defines.
var TopologyPresetNames = []string{"default", "gke", "aws", "topograph"}

// ValidateMusterGangArgs reports every invalid field of args with its path.
func ValidateMusterGangArgs(path *field.Path, args *MusterGangArgs) error {
	var errs field.ErrorList
	if args.DefaultScheduleTimeoutSeconds <= 0 || args.DefaultScheduleTimeoutSeconds > MaxScheduleTimeoutSeconds {
		errs = append(errs, field.Invalid(path.Child("defaultScheduleTimeoutSeconds"), args.DefaultScheduleTimeoutSeconds,
			fmt.Sprintf("must be between 1 and %d (the framework caps a Permit wait at 15 minutes)", MaxScheduleTimeoutSeconds)))
	}
	if args.GangBackoffSeconds < 0 || args.GangBackoffSeconds > 3600 {
		errs = append(errs, field.Invalid(path.Child("gangBackoffSeconds"), args.GangBackoffSeconds, "must be between 0 and 3600"))
	}
	for _, msg := range validation.IsQualifiedName(args.GPUResourceName) {
		errs = append(errs, field.Invalid(path.Child("gpuResourceName"), args.GPUResourceName, msg))
	}

	for i, class := range args.GPUDeviceClasses {
		for _, msg := range validation.IsDNS1123Subdomain(class) {
			errs = append(errs, field.Invalid(path.Child("gpuDeviceClasses").Index(i), class, msg))
		}
	}

	if args.ProvisioningClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(args.ProvisioningClassName) {
			errs = append(errs, field.Invalid(path.Child("provisioningClassName"), args.ProvisioningClassName, msg))
		}
	}

	errs = append(errs, validateTopologyLevels(path.Child("topologyPreset"), path.Child("topologyLevels"), args.TopologyPreset, args.TopologyLevels)...)

	for i, m := range args.PreemptibleNodeMatchers {
		p := path.Child("preemptibleNodeMatchers").Index(i)
		if m.Source != NodeMatcherLabel && m.Source != NodeMatcherTaint {
			errs = append(errs, field.NotSupported(p.Child("source"), m.Source, []string{string(NodeMatcherLabel), string(NodeMatcherTaint)}))
		}
		for _, msg := range validation.IsQualifiedName(m.Key) {
			errs = append(errs, field.Invalid(p.Child("key"), m.Key, msg))
		}
		if m.Value != "" {
			for _, msg := range validation.IsValidLabelValue(m.Value) {
				errs = append(errs, field.Invalid(p.Child("value"), m.Value, msg))
			}
		}
	}
	for i, key := range args.ReclaimTaintKeys {
		for _, msg := range validation.IsQualifiedName(key) {
			errs = append(errs, field.Invalid(path.Child("reclaimTaintKeys").Index(i), key, msg))
		}
	}
	return errs.ToAggregate()
}

// ValidateTopologyLevels reports every invalid level, for tools that take
// muster's levels by other means than its configuration (kubectl muster).
func ValidateTopologyLevels(levelsPath *field.Path, levels []TopologyLevel) error {
	return validateTopologyLevels(nil, levelsPath, "", levels).ToAggregate()
}

// validateTopologyLevels checks the preset's name and the levels: at least
// one of the two, names DNS labels, sources qualified names, none twice.
func validateTopologyLevels(presetPath, levelsPath *field.Path, preset string, levels []TopologyLevel) field.ErrorList {
	var errs field.ErrorList
	if preset != "" && !slices.Contains(TopologyPresetNames, preset) {
		errs = append(errs, field.NotSupported(presetPath, preset, TopologyPresetNames))
	}
	if len(levels) == 0 && preset == "" {
		errs = append(errs, field.Required(levelsPath, "at least one topology level is needed"))
	}
	names, labels := sets.New[string](), sets.New[string]()
	for i, level := range levels {
		p := levelsPath.Index(i)
		if msgs := validation.IsDNS1123Label(level.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("name"), level.Name, msgs[0]))
		} else if names.Has(level.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), level.Name))
		}
		names.Insert(level.Name)
		source, value := p.Child("nodeLabel"), level.NodeLabel
		if level.DeviceAttribute != "" {
			source, value = p.Child("deviceAttribute"), level.DeviceAttribute
			if level.NodeLabel != "" {
				errs = append(errs, field.Invalid(p.Child("nodeLabel"), level.NodeLabel, "a level has a nodeLabel or a deviceAttribute, not both"))
			}
			if !strings.Contains(value, "/") {
				errs = append(errs, field.Invalid(source, value, "must be domain/name, the domain being the driver's"))
			}
		}
		if msgs := validation.IsQualifiedName(value); len(msgs) > 0 {
			errs = append(errs, field.Invalid(source, value, msgs[0]))
		} else if labels.Has(value) {
			errs = append(errs, field.Duplicate(source, value))
		}
		labels.Insert(value)
	}
	return errs
}
