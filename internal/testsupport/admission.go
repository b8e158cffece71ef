package testsupport

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DenyVolumeAttachmentsOf makes the API server refuse every create of a
// VolumeAttachment of the PV pv: a ValidatingAdmissionPolicy named policy
// (message "volume <pv> is frozen") and its binding named binding. The
// API server applies it within a second or so. remove deletes both.
func DenyVolumeAttachmentsOf(ctx context.Context, client kubernetes.Interface, pv, policy, binding string) (remove func(context.Context), err error) {
	fail := admissionregistrationv1.Fail
	p := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"storage.k8s.io"}, APIVersions: []string{"v1"},
						Resources: []string{"volumeattachments"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("!has(object.spec.source.persistentVolumeName) || object.spec.source.persistentVolumeName != %q", pv),
				Message:    fmt.Sprintf("volume %s is frozen", pv),
			}},
		},
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	api := client.AdmissionregistrationV1()
	remove = func(ctx context.Context) {
		_ = api.ValidatingAdmissionPolicyBindings().Delete(ctx, binding, metav1.DeleteOptions{})
		_ = api.ValidatingAdmissionPolicies().Delete(ctx, policy, metav1.DeleteOptions{})
	}
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return remove, fmt.Errorf("create ValidatingAdmissionPolicy %s: %w", policy, err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		return remove, fmt.Errorf("create ValidatingAdmissionPolicyBinding %s: %w", binding, err)
	}
	return remove, nil
}
