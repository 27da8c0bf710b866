package tfconfig

// Names users type on their Jobs and StatefulSets (docs/tfconfig.md). Everything is under muster.dev/.
const (
	// OptInLabel on a batch/v1 Job or an apps/v1 StatefulSet asks the controller for a TF_CONFIG
	// Secret. The value must be "true".
	OptInLabel = "muster.dev/tf-config"
	// GroupLabel ties several Indexed Jobs or StatefulSets (one per TensorFlow role) into one cluster.
	GroupLabel = "muster.dev/tf-group"
	// RoleAnnotation is the TensorFlow task type a workload's pods run: chief, worker (default), ps or evaluator.
	RoleAnnotation = "muster.dev/tf-role"
	// GroupRolesAnnotation optionally lists the roles a group must have (comma-separated) before any
	// Secret of the group is written, so that no pod starts with a partial cluster.
	GroupRolesAnnotation = "muster.dev/tf-group-roles"

	// JobLabel is put on every Secret and Service the controller creates; its value is the name of the
	// Job or StatefulSet (the TensorFlow job). The controller's Service informer watches only Services
	// carrying it.
	JobLabel = "muster.dev/tf-config-job"

	// SecretSuffix: the Secret of Job or StatefulSet <name> is <name>-tf-config.
	SecretSuffix = "-tf-config"
	// ClusterKey is the Secret key holding the cluster spec JSON.
	ClusterKey = "cluster"
	// PortName is the name of the container port TensorFlow's gRPC server listens on (Kubeflow's convention).
	PortName = "tfjob-port"
	// DefaultPort is used when no container declares a port named PortName.
	DefaultPort int32 = 2222

	// ControllerName is the event source and the leader-election lease name.
	ControllerName = "muster-tfconfig-controller"
	// FieldManager is the field manager of the controller's server-side applies. Fields written under
	// this name (by apply, or by update in versions before it applied) are the controller's.
	FieldManager = ControllerName
)

// Event reasons. Warning unless noted.
const (
	ReasonNotIndexed          = "NotIndexed"
	ReasonParallelismMismatch = "ParallelismNotCompletions"
	ReasonMissingSubdomain    = "MissingSubdomain"
	ReasonMissingServiceName  = "MissingServiceName"
	ReasonInvalidOrdinals     = "InvalidOrdinals"
	ReasonInvalidPort         = "InvalidPort"
	ReasonInvalidName         = "InvalidName"
	ReasonInvalidRole         = "InvalidRole"
	ReasonInvalidReplicas     = "InvalidReplicas"
	ReasonInvalidGroup        = "InvalidGroup"
	ReasonClusterTooLarge     = "ClusterTooLarge"
	ReasonSecretConflict      = "SecretConflict"
	ReasonServiceConflict     = "ServiceConflict"
	ReasonWaitingForGroup     = "WaitingForGroup" // Normal
	ReasonScaledToZero        = "ScaledToZero"    // Normal
	ReasonSecretApplied       = "SecretApplied"   // Normal: first write of this controller instance
	ReasonSecretUpdated       = "SecretUpdated"   // Normal: the cluster changed
	ReasonServiceCreated      = "ServiceCreated"  // Normal
)

// SecretName returns the name of the Secret holding the cluster spec of the Job or StatefulSet name.
func SecretName(name string) string { return name + SecretSuffix }
