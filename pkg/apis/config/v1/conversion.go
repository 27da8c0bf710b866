package v1

import (
	"k8s.io/apimachinery/pkg/conversion"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// Convert_config_MusterGangArgs_To_v1_MusterGangArgs leaves topologyPreset
// out when the internal args name none (their levels were given), so a
// written-out configuration does not carry an empty preset.
func Convert_config_MusterGangArgs_To_v1_MusterGangArgs(in *config.MusterGangArgs, out *MusterGangArgs, s conversion.Scope) error {
	if err := autoConvert_config_MusterGangArgs_To_v1_MusterGangArgs(in, out, s); err != nil {
		return err
	}
	if in.TopologyPreset == "" {
		out.TopologyPreset = nil
	}
	return nil
}
